// Hostile framings (RFC 9112): every request whose length, Host or target could be read two ways
// is refused and its connection closed, so that nothing after it (a smuggled request) is ever
// answered; well-framed oddities (chunk extensions, trailers, absolute-form targets) are served.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "endpoint/common.hpp"

using namespace endpoint_test_support;

namespace {

/// What follows each hostile request on its connection: answered only if the framing was
/// misread.
constexpr char kSmuggled[] = "GET /greeting/smuggled HTTP/1.1\r\nHost: a\r\n\r\n";

struct Case {
  const char* name;
  std::string request;  // sent as is, followed by kSmuggled
  unsigned status;
  const char* detail;  // part of the error's detail (empty: a success)
};

/// The hostile ones: answered with `status` and closed.
const std::vector<Case>& refused() {
  static const std::vector<Case> cases = {
      {"TeGzip", "GET /greeting/a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400,
       "must end with chunked"},
      {"TeIdentity", "GET /greeting/a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
       400, "must end with chunked"},
      {"TeXchunked", "GET /greeting/a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
       400, "must end with chunked"},
      {"TeChunkedThenIdentity",
       "GET /greeting/a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n", 400,
       "must end with chunked"},
      {"TeGzipWithContentLength",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}",
       400, "must end with chunked"},
      {"ContentLengthThenChunked",
       "POST /orders HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: "
       "chunked\r\n\r\n{}",
       400, "Transfer-Encoding"},
      {"ChunkedThenContentLength",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: "
       "2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
       400, "Content-Length"},
      {"ChunkedTwice",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
       "chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
       400, "repeats chunked"},
      {"GzipThenChunkedIsNotImplemented",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: "
       "chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
       501, "'gzip' is not supported"},
      {"TransferEncodingInHttp10",
       "POST /orders HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400,
       "HTTP/1.0"},
      {"ContentLengthsThatDisagree",
       "POST /orders HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", 400,
       "Content-Length"},
      {"ContentLengthWithSign", "POST /orders HTTP/1.1\r\nHost: a\r\nContent-Length: +2\r\n\r\n{}",
       400, "Content-Length"},
      {"NoHostInHttp11", "GET /greeting/a HTTP/1.1\r\n\r\n", 400, "needs a Host"},
      {"TwoHosts", "GET /greeting/a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400,
       "more than one Host"},
      {"HostWithASpace", "GET /greeting/a HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "not a host"},
      {"ObsFoldHidingTransferEncodingInHost",
       "GET /greeting/a HTTP/1.1\r\nHost: a\r\n Transfer-Encoding: chunked\r\n\r\n", 400,
       "not a host"},
      {"BareLfEndingTheRequestLine", "GET /greeting/a HTTP/1.1\nHost: a\r\n\r\n", 400, "CR LF"},
      {"BareLfEndingAField", "GET /greeting/a HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", 400, "bare LF"},
      {"SpaceBeforeTheColon",
       "GET /greeting/a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n", 400,
       "whitespace before its colon"},
      {"HugeChunkSize",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: "
       "chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\n",
       400, "chunk's size"},
      {"ChunkSizeEndingInBareLf",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\n{}\r\n0\r\n\r\n",
       400, "chunk"},
      {"ChunkDataLongerThanItsSize",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: "
       "chunked\r\n\r\n2\r\n{}xx\r\n0\r\n\r\n",
       400, "chunk"},
      {"NoHttpVersion", "GET /greeting/a\r\n\r\n", 400, "HTTP version"},
  };
  return cases;
}

/// Well framed, if unusual: answered 200 with `detail` in the body, connection kept.
const std::vector<Case>& served() {
  static const std::vector<Case> cases = {
      {"ChunkExtensions",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
       "10;name=value;flag\r\n{\"customer\":\"e\"}\r\n0;last\r\n\r\n",
       200, R"("customer":"e")"},
      {"Trailers",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
       "10\r\n{\"customer\":\"t\"}\r\n0\r\nX-Checksum: 1\r\n\r\n",
       200, R"("customer":"t")"},
      {"ChunkedInCapitals",
       "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n"
       "10\r\n{\"customer\":\"c\"}\r\n0\r\n\r\n",
       200, R"("customer":"c")"},
      {"RepeatedEqualContentLength",
       "POST /orders HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\n\r\n{}", 200, "{"},
      {"ObsFoldInAnOrdinaryField", "GET /greeting/fold HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
       200, "Hello fold"},
      {"AbsoluteForm", "GET http://a/greeting/abs HTTP/1.1\r\nHost: ignored\r\n\r\n", 200,
       "Hello abs"},
      {"AbsoluteFormWithQuery", "GET https://a/greeting/q?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", 200,
       "Hello q"},
      {"Http10WithoutHost", "GET /greeting/old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 200,
       "Hello old"},
      {"EmptyHost", "GET /greeting/e HTTP/1.1\r\nHost:\r\n\r\n", 200, "Hello e"},
      {"HostWithPort", "GET /greeting/p HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", 200, "Hello p"},
  };
  return cases;
}

class Framing : public ::testing::Test {
 protected:
  void SetUp() override {
    http.route(Method::kGet, "/greeting/{name}", greet);
    http.route(Method::kPost, "/orders", echo);
    http.start();
  }
  Services services;
  Server http{services.bus, ServerOptions().max_body_bytes(1024)};
};

}  // namespace

TEST_F(Framing, AmbiguousRequestsAreRefusedClosedAndWhatFollowsIsNeverAnswered) {
  uint64_t bad = 0;
  for (const Case& c : refused()) {
    SCOPED_TRACE(c.name);
    http_test::Connection conn(http.port());
    ASSERT_TRUE(conn.write_raw(c.request + kSmuggled));
    auto r = conn.read();
    EXPECT_EQ(r.status, c.status) << describe(r);
    EXPECT_TRUE(contains(r.body, c.detail)) << r.body;
    EXPECT_EQ(r.header("Content-Type"), "application/json");
    EXPECT_TRUE(conn.closed_by_peer());
    EXPECT_FALSE(contains(conn.received(), "smuggled")) << conn.received();
    EXPECT_EQ(http.stats().bad_requests, ++bad);
  }
}

TEST_F(Framing, UnusualButWellFramedRequestsAreServedAndKeepTheConnection) {
  for (const Case& c : served()) {
    SCOPED_TRACE(c.name);
    http_test::Connection conn(http.port());
    ASSERT_TRUE(conn.write_raw(c.request));
    auto r = conn.read();
    EXPECT_EQ(r.status, c.status) << describe(r);
    EXPECT_TRUE(contains(r.body, c.detail)) << r.body;
    // The next request on the connection is read where the first one ended.
    auto next = conn.request("GET", "/greeting/next");
    EXPECT_EQ(next.body, R"({"message":"Hello next"})") << describe(next);
  }
  EXPECT_EQ(http.stats().bad_requests, 0u);
}

TEST_F(Framing, NulAndInvalidUtf8InParametersAreRefusedNotCut) {
  http_test::Connection c(http.port());
  auto nul = c.request("GET", "/greeting/ab%00cd");
  EXPECT_EQ(nul.status, 400u) << describe(nul);
  EXPECT_EQ(nul.body, error_json("bad_request",
                                 "path parameter 'name' holds a NUL (%00), which no text may "
                                 "contain"));
  auto ff = c.request("GET", "/greeting/%FF%FE");
  EXPECT_EQ(ff.status, 400u) << describe(ff);
  EXPECT_EQ(ff.body,
            error_json("bad_request", "path parameter 'name' is not UTF-8 once percent-decoded"));
  auto query = c.request("POST", "/orders?customer=a%00b", "{}");
  EXPECT_EQ(query.status, 400u) << describe(query);
  EXPECT_TRUE(contains(query.body, "query parameter 'customer' holds a NUL")) << query.body;
  // Raw bytes outside ASCII are no target at all.
  ASSERT_TRUE(c.write_raw("GET /greeting/\xff\xfe HTTP/1.1\r\nHost: a\r\n\r\n"));
  auto raw = c.read();
  EXPECT_EQ(raw.status, 400u) << describe(raw);
  EXPECT_TRUE(contains(raw.body, "visible ASCII")) << raw.body;
  // Valid UTF-8, percent-encoded, goes through whole; none of the refusals closed the connection.
  auto utf8 = c.request("GET", "/greeting/%C3%A9t%C3%A9");
  EXPECT_EQ(utf8.body, R"({"message":"Hello été"})") << describe(utf8);
}

TEST_F(Framing, OptionsAsteriskAndOptionsOnAPathListTheMethods) {
  http_test::Connection c(http.port());
  auto star = c.request("OPTIONS", "*");
  EXPECT_EQ(star.status, 200u) << describe(star);
  EXPECT_EQ(star.header("Allow"), "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
  EXPECT_EQ(star.header("Content-Length"), "0");
  EXPECT_FALSE(star.has_header("Content-Type"));
  auto path = c.request("OPTIONS", "/greeting/x");
  EXPECT_EQ(path.status, 200u) << describe(path);
  EXPECT_EQ(path.header("Allow"), "GET, HEAD, OPTIONS");
  EXPECT_EQ(c.request("OPTIONS", "/nowhere").status, 404u);
  auto get_star = c.request("GET", "*");
  EXPECT_EQ(get_star.status, 400u) << describe(get_star);
  EXPECT_EQ(get_star.body, error_json("bad_request", "'*' is a request target for OPTIONS only"));
}
