// The compose example as users run it: shop_server called by curl over real HTTP. A quote is
// two bus calls composed under one deadline; a rate limit per API key answers 429.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>

#include "integration/process.hpp"

using namespace std::chrono_literals;

namespace {

using integ::curl;

std::string base_url(integ::Child& server) { return integ::printed_base_url(server, "/quote"); }

void stop(integ::Child& server) {
  ::kill(server.pid(), SIGTERM);
  int status = server.wait(30s);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace

TEST(ShopExample, AQuoteCombinesBothServices) {
  integ::Child server({SHOP_SERVER, "--port=0"});
  std::string base = base_url(server);
  ASSERT_FALSE(base.empty());
  EXPECT_EQ(curl({base + "/quote/tea"}),
            R"({"item":"tea","priceCents":250,"available":12,"priceStatus":"ok",)"
            R"("stockStatus":"ok"})");
  stop(server);
}

TEST(ShopExample, ASlowServiceCostsItsPartNotTheQuote) {
  // The stock service takes an hour; the quote's deadline is 1 s (long enough for the price
  // service of a freshly started, sanitized process to answer in time).
  integ::Child server({SHOP_SERVER, "--port=0", "--deadline_ms=1000", "--stock_delay_ms=3600000"});
  std::string base = base_url(server);
  ASSERT_FALSE(base.empty());
  std::string out = curl({"-w", " %{http_code}", base + "/quote/coffee"});
  EXPECT_EQ(out.substr(0, out.find("\"stockStatus\"")),
            R"({"item":"coffee","priceCents":400,"available":0,"priceStatus":"ok",)")
      << out;
  EXPECT_NE(out.find(R"("stockStatus":"DEADLINE_EXCEEDED: )"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - 4), " 200") << out;
  stop(server);
}

TEST(ShopExample, TheRateLimitIsPerApiKey) {
  integ::Child server({SHOP_SERVER, "--port=0", "--limit=3"});
  std::string base = base_url(server);
  ASSERT_FALSE(base.empty());
  std::vector<std::string> codes;
  for (int i = 0; i < 5; ++i) {
    codes.push_back(curl(
        {"-o", "/dev/null", "-w", "%{http_code}", "-H", "X-Api-Key: alice", base + "/quote/tea"}));
  }
  // Five requests inside one minute-long window: 3 admitted, 2 refused (unless a new window
  // began between them, which gives more 200s).
  int ok = 0, limited = 0;
  for (const auto& c : codes) {
    ok += c == "200";
    limited += c == "429";
  }
  EXPECT_EQ(ok + limited, 5) << testing::PrintToString(codes);
  EXPECT_GE(ok, 3) << testing::PrintToString(codes);
  if (limited == 0) GTEST_SKIP() << "a new minute began between the requests";
  EXPECT_EQ(codes[0], "200");
  EXPECT_EQ(codes[3], "429");
  std::string headers =
      curl({"-D", "-", "-o", "/dev/null", "-H", "X-Api-Key: alice", base + "/quote/tea"});
  if (headers.find(" 429") != std::string::npos) {
    EXPECT_NE(headers.find("Retry-After: "), std::string::npos) << headers;
  }
  EXPECT_EQ(
      curl({"-o", "/dev/null", "-w", "%{http_code}", "-H", "X-Api-Key: bob", base + "/quote/tea"}),
      "200");
  stop(server);
}
