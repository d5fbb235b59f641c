// Validates JSON instances against the component schemas of an OpenAPI 3.1 document with Ajv
// (JSON Schema draft 2020-12, the dialect of OpenAPI 3.1), for tests/endpoint/openapi_test.cpp.
//
//   node check_schemas.cjs NODE_MODULES CASES.json
//
// CASES.json: {"document": <the OpenAPI document>, "cases": [{"label": "...", "schema": "Order",
// "instance": <any JSON>, "expect": true}, ...]}. Prints each case whose verdict is not the one
// expected, with Ajv's errors, and exits 1 if there is one; 2 when it cannot run at all.
"use strict";
const fs = require("fs");
const path = require("path");

const [modules, casesFile] = process.argv.slice(2);
if (!modules || !casesFile) {
  console.error("usage: node check_schemas.cjs NODE_MODULES CASES.json");
  process.exit(2);
}
const Ajv2020 = require(path.join(modules, "ajv/dist/2020")).default;
const { document, cases } = JSON.parse(fs.readFileSync(casesFile, "utf8"));

// strict: false: the document is an OpenAPI document, not a schema, and its other members are
// keywords Ajv does not know. OpenAPI's formats only annotate.
const formats = { int32: true, int64: true, float: true, double: true };
const ajv = new Ajv2020({ strict: false, allErrors: true, formats });
ajv.addSchema(document, "openapi.json");

let wrong = 0;
for (const c of cases) {
  const validate = ajv.getSchema("openapi.json#/components/schemas/" + c.schema);
  if (!validate) {
    console.log(`${c.label}: no schema ${c.schema}`);
    ++wrong;
    continue;
  }
  const valid = validate(c.instance);
  if (valid !== c.expect) {
    ++wrong;
    console.log(`${c.label}: ${JSON.stringify(c.instance)} is ${valid ? "valid" : "invalid"} ` +
                `for ${c.schema}, but the server ${c.expect ? "takes" : "refuses"} it` +
                (valid ? "" : ": " + ajv.errorsText(validate.errors)));
  }
}
console.log(`${cases.length - wrong} of ${cases.length} cases as expected`);
process.exit(wrong === 0 ? 0 : 1);
