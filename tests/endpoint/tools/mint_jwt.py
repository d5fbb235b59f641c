#!/usr/bin/env python3
"""Mints a JWT with PyJWT for the endpoint tests: an implementation other than the server's.

    mint_jwt.py ALG KEY_FILE CLAIMS_JSON [HEADERS_JSON]   prints the token
    mint_jwt.py --jwks OUT.json KID=PEM_FILE... [KID=oct:SECRET_FILE]  writes a JWK Set

KEY_FILE holds a PEM private key (RS256, ES256) or the raw secret (HS256, and the algorithm
confusion case: HS256 with a public key's PEM as the secret). ALG "none" makes an unsigned token.
"""
import json
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


def jwks(out, specs):
    keys = []
    for spec in specs:
        kid, path = spec.split("=", 1)
        if path.startswith("oct:"):
            with open(path[4:], "rb") as f:
                secret = f.read()
            k = json.loads(jwt.algorithms.HMACAlgorithm.to_jwk(secret))
        else:
            with open(path, "rb") as f:
                pub = serialization.load_pem_public_key(f.read())
            algo = RSAAlgorithm if "RSA" in type(pub).__name__ else ECAlgorithm
            k = json.loads(algo.to_jwk(pub))
        k["kid"] = kid
        keys.append(k)
    with open(out, "w") as f:
        json.dump({"keys": keys}, f)


def main():
    if sys.argv[1] == "--jwks":
        return jwks(sys.argv[2], sys.argv[3:])
    alg, key_file, claims = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    headers = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    if alg == "none":
        token = jwt.encode(claims, None, algorithm="none", headers=headers)
    else:
        with open(key_file, "rb") as f:
            key = f.read()
        if alg == "HS256":
            # PyJWT refuses a PEM as an HMAC secret: sign by hand for the confusion case.
            import base64, hashlib, hmac
            b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
            head = {"alg": "HS256", "typ": "JWT", **(headers or {})}
            signing = b64(json.dumps(head).encode()) + "." + b64(json.dumps(claims).encode())
            sig = hmac.new(key, signing.encode(), hashlib.sha256).digest()
            token = signing + "." + b64(sig)
        else:
            token = jwt.encode(claims, key, algorithm=alg, headers=headers)
    print(token)


if __name__ == "__main__":
    main()
