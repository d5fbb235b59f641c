// Routes: every template shape, the JSON <-> Cap'n Proto mapping, plain types with mappings,
// direct handlers, and the routes start() refuses.
#include <absl/strings/numbers.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "endpoint/common.hpp"

using namespace endpoint_test_support;
using http_test::get;
using http_test::RequestSpec;

/// A C++ type with a bus::Codec: the JSON mapping goes through its schema (Address).
struct Place {
  std::string street;
  std::string city;
};
template <>
struct bus::Codec<Place> {
  using Schema = endpoint_test::Address;
  static void encode(const Place& p, endpoint_test::Address::Builder b) {
    b.setStreet(p.street);
    b.setCity(p.city);
  }
  static Place decode(endpoint_test::Address::Reader r) {
    return Place{r.getStreet().cStr(), r.getCity().cStr()};
  }
};

namespace {

inline const bus::Endpoint<Place, Place> places{"test.http.places", bus::Overflow::kFail};

/// A plain C++ request and reply: no Cap'n Proto schema, so the route maps them.
struct Sum {
  int a = 0;
  int b = 0;
};
inline const bus::Endpoint<Sum, int> add_ep{"test.http.add", bus::Overflow::kFail};
/// Says which of its union's members a Note holds, and its data, as text.
inline const bus::Endpoint<bus::Message<endpoint_test::Note>, Greeting> notes{"test.http.notes",
                                                                              bus::Overflow::kFail};
/// Answers NotFound for any id but 1.
inline const bus::Endpoint<Order, Order> lookup{"test.http.lookup", bus::Overflow::kFail};

class Routes : public ::testing::Test {
 protected:
  void SetUp() override {
    http.route(Method::kGet, "/services/myservice/ping", ping).reply([](const PingReply& r) {
      return Reply::json(bus::http::to_json(r->getGreetings()));
    });
    http.route(Method::kGet, "/greeting/{name}", greet);
    http.route(Method::kGet, "/orders/{id}", echo);
    // Added after its parameter twin: the literal must still win.
    http.handle(Method::kGet, "/orders/new",
                [](const Request&) { return Reply::text("new order form"); });
    // Added before its parameter twin.
    http.handle(Method::kGet, "/items/new",
                [](const Request&) { return Reply::text("new item form"); });
    http.handle(Method::kGet, "/items/{id}", [](const Request& r) {
      return Reply::text("item " + std::string(*r.param("id")));
    });
    http.route(Method::kGet, "/customers/{customer}/orders/{id}", echo);
    http.route(Method::kPost, "/orders", echo);
    http.route(Method::kPost, "/orders/{id}", echo);
    http.route(Method::kGet, "/lookup/{id}", lookup);
    http.route(Method::kGet, "/add/{a}/{b}", add_ep)
        .request([](const Request& r) -> absl::StatusOr<Sum> {
          Sum s;
          std::string_view a = *r.param("a"), b = *r.param("b");
          if (!absl::SimpleAtoi(absl::string_view(a.data(), a.size()), &s.a) ||
              !absl::SimpleAtoi(absl::string_view(b.data(), b.size()), &s.b)) {
            return absl::InvalidArgumentError("a and b must be integers");
          }
          return s;
        })
        .reply([](const int& n) { return Reply::text(std::to_string(n)); });
    http.route(Method::kGet, "/mapping-throws/{a}", add_ep)
        .request([](const Request&) -> absl::StatusOr<Sum> {
          throw std::runtime_error("the mapping threw");
        })
        .reply([](const int& n) { return Reply::text(std::to_string(n)); });
    http.route(Method::kGet, "/reply-throws/{a}/{b}", add_ep)
        .request([](const Request&) -> absl::StatusOr<Sum> {
          return Sum{1, 2};
        })
        .reply([](const int&) -> Reply { throw std::runtime_error("the reply mapping threw"); });
    http.route(Method::kGet, "/places/{city}", places);
    http.route(Method::kGet, "/notes/{text}", notes);
    http.route(Method::kGet, "/notes", notes);
    http.handle(Method::kGet, "/direct/{x}", [](const Request& r) {
      std::string agent(r.header("user-agent").value_or("none"));
      return Reply::text("direct " + std::string(*r.param("x")) + " from " + agent);
    });
    http.start();
    port = http.port();
  }

  Services services;
  bus::Bus& bus = services.bus;
  bus::Subscription adding = bus.serve(add_ep, [](Sum&& s) { return s.a + s.b; });
  bus::Subscription looking_up = bus.serve(lookup, [](Order&& o) -> absl::StatusOr<Order> {
    if (o->getId() != 1) return absl::NotFoundError("no order " + std::to_string(o->getId()));
    return std::move(o);
  });
  bus::Subscription placing = bus.serve(places, [](Place&& p) {
    return Place{p.street, p.city + "!"};
  });
  bus::Subscription noting = bus.serve(notes, [](bus::Message<endpoint_test::Note>&& n) {
    std::string held = n->isText() ? "text " + std::string(n->getText().cStr()) : "none";
    held += ", blob";
    for (kj::byte c : n->getBlob())
      held += c == 0 ? std::string(" \\0") : " " + std::string(1, char(c));
    return bus::build<greeting::Greeting>(
        [&](greeting::Greeting::Builder b) { b.setMessage(held); });
  });
  Server http{bus, ServerOptions()};
  uint16_t port = 0;
};

}  // namespace

// ---- route shapes ---------------------------------------------------------------------------

TEST_F(Routes, LiteralPathAnswersTheReplyAsJson) {
  auto r = get(port, "/services/myservice/ping");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(r.body, R"(["Hello World!"])");
}

TEST_F(Routes, OnePathParameterFillsItsField) {
  auto r = get(port, "/greeting/Sergio");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(r.body, R"({"message":"Hello Sergio"})");
}

TEST_F(Routes, TwoPathParametersFillTheirFields) {
  auto r = get(port, "/customers/ann/orders/42");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, R"({"id":42,"customer":"ann",)")) << r.body;
}

TEST_F(Routes, PathAndQueryParametersFillTheirFieldsAndUnknownQueryIsIgnored) {
  auto r = get(port, "/orders/7?customer=Ann+Lee&quantity=3&utm_source=mail");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, R"({"id":7,"customer":"Ann Lee","quantity":3,)")) << r.body;
}

TEST_F(Routes, QueryParameterCannotOverrideAPathParameter) {
  auto r = get(port, "/orders/7?id=8");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, R"({"id":7,)")) << r.body;
}

TEST_F(Routes, PostJsonBodyFillsTheRequest) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders",
                     R"({"id":5,"customer":"bob","quantity":-2,"price":9.5,"express":true,)"
                     R"("kind":"gift","big":"9007199254740993","address":{"city":"Lisbon"}})",
                     {{"Content-Type", "application/json"}});
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"id":5,"customer":"bob","quantity":-2,"price":9.5,"express":true,)"
                    R"("kind":"gift","big":"9007199254740993","address":{"city":"Lisbon"}})");
}

TEST_F(Routes, PostWithNoBodyIsAnEmptyObject) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, R"({"id":0,"quantity":0,)")) << r.body;
}

TEST_F(Routes, PathParameterOverridesABodyField) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders/9", R"({"id":1,"customer":"body"})");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, R"({"id":9,"customer":"body",)")) << r.body;
}

TEST_F(Routes, QueryParameterOverridesABodyField) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders/9?customer=query", R"({"customer":"body","quantity":4})");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, R"({"id":9,"customer":"query","quantity":4,)")) << r.body;
}

TEST_F(Routes, PercentEncodedParameterIsDecoded) {
  auto r = get(port, "/greeting/S%C3%A9rgio");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, "{\"message\":\"Hello S\xC3\xA9rgio\"}");
}

TEST_F(Routes, PercentEncodedSlashStaysInsideItsParameter) {
  auto r = get(port, "/greeting/a%2Fb");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"message":"Hello a/b"})");
}

TEST_F(Routes, LiteralSegmentWinsOverAParameterAddedBeforeIt) {
  auto r = get(port, "/orders/new");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, "new order form");
  auto other = get(port, "/orders/12");
  ASSERT_EQ(other.status, 200u) << describe(other);
  EXPECT_TRUE(starts_with(other.body, R"({"id":12,)")) << other.body;
}

TEST_F(Routes, LiteralSegmentWinsOverAParameterAddedAfterIt) {
  auto r = get(port, "/items/new");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, "new item form");
  auto other = get(port, "/items/12");
  ASSERT_EQ(other.status, 200u) << describe(other);
  EXPECT_EQ(other.body, "item 12");
}

TEST_F(Routes, HeadOnAGetRouteSendsTheHeadersWithoutTheBody) {
  http_test::Connection c(port);
  auto full = c.request("GET", "/greeting/Sergio");
  ASSERT_EQ(full.status, 200u) << describe(full);
  auto head = c.request("HEAD", "/greeting/Sergio");
  ASSERT_EQ(head.status, 200u) << describe(head);
  EXPECT_EQ(head.header("Content-Length"), std::to_string(full.body.size()));
  EXPECT_EQ(head.header("Content-Type"), "application/json");
  // No body bytes followed the headers: the next response on this connection parses cleanly.
  EXPECT_TRUE(c.received().empty()) << c.received();
  auto next = c.request("GET", "/greeting/Next");
  ASSERT_EQ(next.status, 200u) << describe(next);
  EXPECT_EQ(next.body, R"({"message":"Hello Next"})");
}

TEST_F(Routes, PlainTypesGoThroughTheirMappings) {
  auto r = get(port, "/add/2/40");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "text/plain; charset=utf-8");
  EXPECT_EQ(r.body, "42");
}

TEST_F(Routes, RequestMappingErrorIsA400WithItsMessage) {
  auto r = get(port, "/add/two/40");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(r.body, error_json("bad_request", "a and b must be integers"));
}

TEST_F(Routes, RequestMappingThatThrowsIsA400) {
  auto r = get(port, "/mapping-throws/1");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_EQ(r.body, error_json("bad_request", "the mapping threw"));
}

TEST_F(Routes, ReplyMappingThatThrowsIsA500) {
  auto r = get(port, "/reply-throws/1/2");
  ASSERT_EQ(r.status, 500u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(r.body, error_json("internal", "writing the reply failed: the reply mapping threw"));
}

TEST_F(Routes, TypeWithACodecIsMappedThroughItsSchema) {
  auto r = get(port, "/places/Lisbon?street=Rua%20Augusta");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"street":"Rua Augusta","city":"Lisbon!"})");
}

TEST_F(Routes, DirectHandlerAnswersWithoutTheBusAndSeesHeaders) {
  http_test::Connection c(port);
  auto r = c.request("GET", "/direct/x1", "", {{"User-Agent", "route-test"}});
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "text/plain; charset=utf-8");
  EXPECT_EQ(r.body, "direct x1 from route-test");
}

// ---- the JSON mapping -----------------------------------------------------------------------

TEST_F(Routes, ParametersAreConvertedToTheirFieldTypes) {
  auto r =
      get(port, "/orders/7?quantity=-3&price=2.5&express=true&kind=gift&big=-9007199254740993");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"id":7,"quantity":-3,"price":2.5,"express":true,"kind":"gift",)"
                    R"("big":"-9007199254740993"})");
}

TEST_F(Routes, TextAndDataParametersFillTheirFieldsAndAUnionMemberIsSelected) {
  // Each twice: the second request finds its fields in the I/O thread's cache.
  for (int i = 0; i < 2; ++i) {
    auto r = get(port, "/notes/hi%20there?blob=ab%00c");
    ASSERT_EQ(r.status, 200u) << describe(r);
    EXPECT_EQ(r.body, R"({"message":"text hi there, blob a b \\0 c"})");
    r = get(port, "/notes?blob=xyz");
    ASSERT_EQ(r.status, 200u) << describe(r);
    EXPECT_EQ(r.body, R"({"message":"none, blob x y z"})");
  }
}

TEST_F(Routes, NonNumericParameterForAnIntegerFieldIsA400) {
  auto r = get(port, "/orders/abc");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, error_prefix("bad_request"))) << r.body;
}

TEST_F(Routes, OutOfRangeParameterIsA400) {
  auto r = get(port, "/orders/99999999999");  // id is a UInt32
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, error_prefix("bad_request"))) << r.body;
}

TEST_F(Routes, BoolParameterOtherThanTrueOrFalseIsA400) {
  auto r = get(port, "/orders/1?express=maybe");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_EQ(r.body,
            error_json("bad_request", "parameter 'express' must be true or false, not 'maybe'"));
}

TEST_F(Routes, NonNumericParameterForAFloatFieldIsA400) {
  auto r = get(port, "/orders/1?price=cheap");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_EQ(r.body, error_json("bad_request", "parameter 'price' must be a number, not 'cheap'"));
}

TEST_F(Routes, UnknownBodyFieldIsA400) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders", R"({"id":1,"colour":"red"})");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_TRUE(starts_with(r.body, error_prefix("bad_request"))) << r.body;
  EXPECT_TRUE(contains(r.body, "colour")) << r.body;
}

TEST_F(Routes, MalformedJsonBodyIsA400) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders", R"({"id":1,)");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_TRUE(starts_with(r.body, error_prefix("bad_request"))) << r.body;
  EXPECT_TRUE(contains(r.body, "JSON")) << r.body;
}

TEST_F(Routes, BodyThatIsNotAnObjectIsA400) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders", "[1,2,3]");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_EQ(r.body, error_json("bad_request", "the body must be an object (Order), not an array"));
}

TEST_F(Routes, BodyErrorsSayWhatWasWrongInTheCallersTerms) {
  http_test::Connection c(port);
  auto expect = [&](std::string body, std::string detail) {
    auto r = c.request("POST", "/orders", body);
    EXPECT_EQ(r.status, 400u) << describe(r);
    EXPECT_EQ(r.body, error_json("bad_request", detail)) << "for " << body;
  };
  expect(R"({"id":1,"colour":"red"})",
         "unknown field 'colour' (Order has: id, customer, quantity, price, express, kind, big, "
         "address)");
  expect(R"({"express":"yes"})", "field 'express' must be true or false, not a string");
  expect(R"({"quantity":3000000000})",
         "field 'quantity' must be an integer from -2147483648 to 2147483647, not a number");
  expect(R"({"id":-1})", "field 'id' must be an integer from 0 to 4294967295, not a number");
  expect(R"({"kind":"urgent"})", "field 'kind' must be one of standard, gift, not 'urgent'");
  expect(R"({"address":{"street":1}})", "field 'address.street' must be a string, not a number");
  expect(R"({"address":{"zip":"x"}})", "unknown field 'address.zip' (Address has: street, city)");
  expect(R"({"id":1,)", "the body is not valid JSON");
  auto param = get(port, "/orders/99999999999");
  EXPECT_EQ(param.body, error_json("bad_request",
                                   "parameter 'id' must be an integer from 0 to 4294967295, not "
                                   "'99999999999'"));
}

TEST_F(Routes, WrongJsonTypeForAFieldIsA400) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders", R"({"express":"yes"})");
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, error_prefix("bad_request"))) << r.body;
}

TEST_F(Routes, DeeplyNestedBodyIsA400NotACrash) {
  std::string deep(10000, '[');
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders", R"({"address":)" + deep);
  ASSERT_EQ(r.status, 400u) << describe(r);
  EXPECT_EQ(get(port, "/greeting/still").status, 200u);
}

TEST_F(Routes, HandlerNotFoundIsA404WithItsMessage) {
  auto r = get(port, "/lookup/2");
  ASSERT_EQ(r.status, 404u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(r.body, error_json("not_found", "no order 2"));
  auto found = get(port, "/lookup/1");
  ASSERT_EQ(found.status, 200u) << describe(found);
  EXPECT_TRUE(starts_with(found.body, R"({"id":1,)")) << found.body;
}

// ---- routes start() refuses -----------------------------------------------------------------

TEST(RouteChecks, PathParameterNamingNoFieldIsRefusedByStart) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  http.route(Method::kGet, "/greeting/{nom}", greet);
  try {
    http.start();
    FAIL() << "start() accepted a parameter that names no field";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "nom")) << e.what();
  }
}

TEST(RouteChecks, PlainRequestTypeWithoutAMappingIsRefusedByStart) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  http.route(Method::kGet, "/add/{a}/{b}", add_ep).reply([](const int& n) {
    return Reply::text(std::to_string(n));
  });
  EXPECT_THROW(http.start(), std::invalid_argument);
}

TEST(RouteChecks, PlainReplyTypeWithoutAMappingIsRefusedByStart) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  http.route(Method::kGet, "/add/{a}/{b}", add_ep)
      .request([](const Request&) -> absl::StatusOr<Sum> { return Sum{}; });
  EXPECT_THROW(http.start(), std::invalid_argument);
}

TEST(RouteChecks, TwoRoutesWithOneMethodAndPathAreRefused) {
  // The header documents the refusal at start(); the router may refuse at the second route()
  // already. Either way the server never starts with both.
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  EXPECT_THROW(
      {
        http.route(Method::kGet, "/greeting/{name}", greet);
        http.route(Method::kGet, "/greeting/{name}", greet);
        http.start();
      },
      std::invalid_argument);
}

TEST(RouteChecks, TwoRoutesWhosePathsDifferOnlyInParameterNamesAreRefused) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  EXPECT_THROW(
      {
        http.route(Method::kGet, "/orders/{id}", echo);
        http.handle(Method::kGet, "/orders/{customer}", [](const Request&) { return Reply{}; });
        http.start();
      },
      std::invalid_argument);
}

TEST(RouteChecks, SamePathWithAnotherMethodIsAccepted) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  http.route(Method::kGet, "/orders/{id}", echo);
  http.route(Method::kPost, "/orders/{id}", echo);
  EXPECT_NO_THROW(http.start());
}

TEST(RouteChecks, PortHeldByAnotherSocketMakesStartThrow) {
  http_test::PortHolder holder;
  ASSERT_NE(holder.port(), 0);
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus, ServerOptions().port(holder.port()));
  http.route(Method::kGet, "/greeting/{name}", greet);
  EXPECT_THROW(http.start(), std::runtime_error);
}

// Every I/O thread's acceptor sets SO_REUSEPORT: without a check of its own, a second server
// (of the same user) would share the port and the kernel would split the connections.
TEST(RouteChecks, PortHeldByAnotherServerMakesStartThrow) {
  bus::Bus bus{bus::Options().executors(1)};
  Server first(bus);
  first.start();
  Server second(bus, ServerOptions().port(first.port()));
  EXPECT_THROW(second.start(), std::runtime_error);
}

TEST(ServerOptionsTest, RoutesAnswerWhetherOrNotTheIoThreadYieldsAfterARound) {
  for (bool yield : {true, false}) {
    Services services;
    Server http(services.bus, ServerOptions().io_threads(2).yield_after_round(yield));
    http.route(Method::kGet, "/greeting/{name}", greet);
    http.start();
    for (int i = 0; i < 20; ++i) {
      auto r = get(http.port(), "/greeting/n" + std::to_string(i));
      ASSERT_EQ(r.status, 200u) << "yield " << yield << ": " << describe(r);
      EXPECT_EQ(r.body, R"({"message":"Hello n)" + std::to_string(i) + R"("})");
    }
  }
}
