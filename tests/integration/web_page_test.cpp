// The greeting example's web page in a real browser: headless Chromium, driven through
// chromedriver over the W3C WebDriver protocol (HTTP + JSON, spoken with curl), shows live the
// greetings that GET /greeting/{name} publishes, and answers its own form over its WebSocket.
// Swagger UI at /docs renders the operations of /openapi.json. Needs Debian's chromium and
// chromium-driver, and npm's swagger-ui-dist (scripts/test.sh installs them).
#include <absl/strings/str_join.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "integration/process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;

namespace {

constexpr char kChromium[] = "/usr/bin/chromium";
constexpr char kChromedriver[] = "/usr/bin/chromedriver";
// The key a WebDriver element reference is stored under (fixed by the W3C spec).
constexpr char kElementKey[] = "element-6066-11e4-a52e-4f735466cecf";

/// A JSON document parsed with Cap'n Proto's codec. The message is on the heap so that `root`
/// stays valid when the document is moved.
struct Json {
  explicit Json(std::string_view text) {
    auto b = message->initRoot<capnp::JsonValue>();
    try {
      capnp::JsonCodec().decodeRaw(kj::ArrayPtr<const char>(text.data(), text.size()), b);
      root = b.asReader();
      ok = true;
    } catch (const kj::Exception&) {
    }
  }
  std::unique_ptr<capnp::MallocMessageBuilder> message =
      std::make_unique<capnp::MallocMessageBuilder>();
  capnp::JsonValue::Reader root;
  bool ok = false;
};

std::optional<capnp::JsonValue::Reader> member(capnp::JsonValue::Reader v, std::string_view name) {
  if (!v.isObject()) return std::nullopt;
  for (auto f : v.getObject()) {
    if (std::string_view(f.getName().cStr(), f.getName().size()) == name) return f.getValue();
  }
  return std::nullopt;
}

std::string string_of(std::optional<capnp::JsonValue::Reader> v) {
  return v && v->isString() ? std::string(v->getString().cStr()) : std::string();
}

/// `s` as a JSON string literal.
std::string json_quoted(std::string_view s) {
  capnp::MallocMessageBuilder b;
  auto v = b.initRoot<capnp::JsonValue>();
  v.setString(capnp::Text::Reader(s.data(), s.size()));
  return capnp::JsonCodec().encodeRaw(v).cStr();
}

/// What a WebDriver command answered: its "value", or `error` when it failed.
struct Answer {
  Json json;
  capnp::JsonValue::Reader value;
  std::string error;  // empty: it succeeded
};

Answer webdriver(const std::string& method, const std::string& url, const std::string& body = "") {
  std::vector<std::string> args = {"-X", method};
  if (!body.empty()) {
    args.insert(args.end(), {"-H", "Content-Type: application/json", "--data-raw", body});
  }
  args.push_back(url);
  std::string out = integ::curl(args);
  Answer a{Json(out), {}, {}};
  auto value = a.json.ok ? member(a.json.root, "value") : std::nullopt;
  if (!value) {
    a.error = method + " " + url + ": no WebDriver answer: '" + out + "'";
    return a;
  }
  a.value = *value;
  if (auto e = member(a.value, "error")) {
    a.error =
        method + " " + url + ": " + string_of(e) + ": " + string_of(member(a.value, "message"));
  }
  return a;
}

/// chromedriver on a port it picks itself (--port=0: no race for a free port; it prints the
/// one it took). It runs in a session of its own (setsid) so that a browser it leaves behind
/// (it orphans them when killed) is killed with its process group.
class Chromedriver {
 public:
  Chromedriver() : process_({"setsid", kChromedriver, "--port=0"}) {
    // "ChromeDriver was started successfully on port 34657."; it exits when it cannot bind.
    constexpr std::string_view kStarted = "started successfully on port ";
    while (auto line = process_.read_line(30s)) {
      if (auto at = line->find(kStarted); at != std::string::npos) {
        std::string port = line->substr(at + kStarted.size());
        port = port.substr(0, port.find_first_not_of("0123456789"));
        if (!port.empty()) url_ = "http://127.0.0.1:" + port;
        break;
      }
    }
  }
  Chromedriver(const Chromedriver&) = delete;
  Chromedriver& operator=(const Chromedriver&) = delete;
  ~Chromedriver() { stop(); }

  /// Its base URL; empty when it did not start.
  const std::string& url() const { return url_; }
  /// Whether it takes new sessions (GET /status).
  bool ready() const {
    if (url_.empty()) return false;
    Answer a = webdriver("GET", url_ + "/status");
    auto r = member(a.value, "ready");
    return r && r->isBoolean() && r->getBoolean();
  }

  /// Quits it and its browsers; true when it exited by itself. Idempotent.
  bool stop() {
    pid_t group = process_.pid();
    if (group <= 0) return true;
    // chromedriver's own command (not W3C): closes every session's browser, then exits.
    if (!url_.empty()) integ::curl({url_ + "/shutdown"});
    int status = process_.wait(30s);  // SIGKILL when it does not exit
    ::kill(-group, SIGKILL);          // what it left behind (nothing, when it exited cleanly)
    return status != -1 && WIFEXITED(status);
  }

 private:
  integ::Child process_;
  std::string url_;
};

/// One browser session of a chromedriver: each method is a WebDriver command.
class Browser {
 public:
  explicit Browser(std::string driver) : driver_(std::move(driver)) {}
  Browser(const Browser&) = delete;
  Browser& operator=(const Browser&) = delete;
  ~Browser() { (void)quit(); }

  /// Starts headless Chromium; the error, or empty.
  std::string start() {
    Answer a = webdriver("POST", driver_ + "/session",
                         R"({"capabilities":{"alwaysMatch":{
        "browserName":"chrome",
        "goog:chromeOptions":{"binary":")" +
                             std::string(kChromium) + R"(","args":[
          "--headless=new","--no-sandbox","--disable-gpu","--disable-dev-shm-usage"]}}}})");
    if (!a.error.empty()) return a.error;
    session_ = string_of(member(a.value, "sessionId"));
    return session_.empty() ? "no sessionId in the answer" : "";
  }
  /// Closes the browser; the error, or empty. Idempotent.
  std::string quit() {
    if (session_.empty()) return {};
    Answer a = webdriver("DELETE", url());
    session_.clear();
    return a.error;
  }

  std::string go(const std::string& page) {
    return webdriver("POST", url() + "/url", R"({"url":)" + json_quoted(page) + "}").error;
  }
  /// Runs `script` (a function body; `arguments[0]` is `arg`) in the page.
  Answer run(const std::string& script, const std::string& arg = "") {
    return webdriver(
        "POST", url() + "/execute/sync",
        R"({"script":)" + json_quoted(script) + R"(,"args":[)" + json_quoted(arg) + "]}");
  }
  /// The text of the element `css` selects; nothing when there is none (or on error).
  std::optional<std::string> text(const std::string& css) {
    Answer a =
        run("const e = document.querySelector(arguments[0]); return e && e.textContent;", css);
    if (!a.error.empty() || !a.value.isString()) return std::nullopt;
    return std::string(a.value.getString().cStr());
  }
  /// The texts of the elements `css` selects, in document order.
  std::vector<std::string> texts(const std::string& css) {
    Answer a = run(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent);", css);
    std::vector<std::string> out;
    if (a.error.empty() && a.value.isArray()) {
      for (auto v : a.value.getArray()) out.push_back(string_of(v));
    }
    return out;
  }
  /// Types `keys` into the element `css` selects, as a user would; the error, or empty.
  std::string type(const std::string& css, const std::string& keys) {
    std::string e = element(css);
    if (e.empty()) return "no element " + css;
    return webdriver("POST", url() + "/element/" + e + "/value",
                     R"({"text":)" + json_quoted(keys) + "}")
        .error;
  }
  std::string click(const std::string& css) {
    std::string e = element(css);
    if (e.empty()) return "no element " + css;
    return webdriver("POST", url() + "/element/" + e + "/click", "{}").error;
  }

 private:
  std::string url() const { return driver_ + "/session/" + session_; }
  std::string element(const std::string& css) {
    Answer a = webdriver("POST", url() + "/element",
                         R"({"using":"css selector","value":)" + json_quoted(css) + "}");
    return a.error.empty() ? string_of(member(a.value, kElementKey)) : std::string();
  }

  std::string driver_;
  std::string session_;
};

}  // namespace

/// greeting_server, chromedriver and one headless Chromium session, started by SetUp; finish()
/// ends them in order and checks that each exits cleanly.
class GreetingInChromium : public ::testing::Test {
 protected:
  void SetUp() override {
    // CI installs them (scripts/test.sh): missing is a broken setup, not a reason to skip.
    ASSERT_EQ(::access(kChromium, X_OK), 0)
        << kChromium << " is missing: bash scripts/deps.sh chromium chromium-driver";
    ASSERT_EQ(::access(kChromedriver, X_OK), 0)
        << kChromedriver << " is missing: bash scripts/deps.sh chromium chromium-driver";
    server_.emplace(std::vector<std::string>{GREETING_SERVER, "--port=0"});
    base_ = integ::printed_base_url(*server_, "/greeting");
    ASSERT_FALSE(base_.empty()) << "greeting_server printed no URL";
    driver_.emplace();
    ASSERT_FALSE(driver_->url().empty()) << "chromedriver did not start (its log is above)";
    ASSERT_TRUE(bus_test::eventually([&] { return driver_->ready(); }))
        << "chromedriver never said ready";
    browser_.emplace(driver_->url());
    std::string error = browser_->start();
    ASSERT_EQ(error, "") << "no Chromium session";
  }

  void finish() {
    EXPECT_EQ(browser_->quit(), "");
    EXPECT_TRUE(driver_->stop()) << "chromedriver did not exit by itself";
    ::kill(server_->pid(), SIGTERM);
    int exit = server_->wait(30s);
    ASSERT_TRUE(WIFEXITED(exit));
    EXPECT_EQ(WEXITSTATUS(exit), 0);
  }

  std::optional<integ::Child> server_;
  std::string base_;  // the greeting's URL: http://127.0.0.1:PORT/greeting
  std::optional<Chromedriver> driver_;
  std::optional<Browser> browser_;
};

using GreetingWebPage = GreetingInChromium;
using GreetingDocsPage = GreetingInChromium;

TEST_F(GreetingWebPage, ShowsPublishedGreetingsLiveAndAnswersItsForm) {
  Browser& browser = *browser_;
  const std::string& base = base_;

  // The page subscribes as soon as its socket opens; publish only once the server said so.
  ASSERT_EQ(browser.go(base + "/"), "");
  std::optional<std::string> status;
  ASSERT_TRUE(bus_test::eventually([&] {
    return (status = browser.text("#status")) == "subscribed";
  })) << "#status: "
      << status.value_or("(no #status)");

  for (std::string name : {"Ada", "Grace", "Linus"}) {
    ASSERT_EQ(integ::curl({base + "/greeting/" + name}), "Hello " + name);
  }
  std::vector<std::string> shown;
  ASSERT_TRUE(bus_test::eventually([&] {
    return (shown = browser.texts("#greetings li")).size() >= 3;
  })) << shown.size()
      << " greetings shown";
  EXPECT_EQ(shown, (std::vector<std::string>{"Hello Ada", "Hello Grace", "Hello Linus"}));

  // The form calls the endpoint over the same socket; the page clears #reply until it answers.
  ASSERT_EQ(browser.type("#name", "Margaret"), "");
  ASSERT_EQ(browser.click("#greet"), "");
  std::optional<std::string> reply;
  ASSERT_TRUE(bus_test::eventually([&] {
    return !(reply = browser.text("#reply")).value_or("").empty();
  })) << "#reply stayed empty";
  EXPECT_EQ(*reply, "Hello Margaret");
  finish();
}

TEST_F(GreetingDocsPage, SwaggerUiShowsTheOperationsOfOpenapiJson) {
  // Swagger UI's files come from npm (swagger-ui-dist); the server reads them at start.
  ASSERT_EQ(::access(SWAGGER_UI_DIR "/swagger-ui-bundle.js", R_OK), 0)
      << SWAGGER_UI_DIR << " is missing: bash scripts/npm_tools.sh";
  Browser& browser = *browser_;
  const std::string& base = base_;

  ASSERT_EQ(browser.go(base + "/docs"), "");
  // Swagger UI fetches /openapi.json and renders one block per operation, its path in data-path.
  std::vector<std::string> paths;
  ASSERT_TRUE(bus_test::eventually([&] {
    Answer a = browser.run(
        "return Array.from(document.querySelectorAll('.opblock-summary-path'))"
        ".map(e => e.getAttribute('data-path'));");
    paths.clear();
    if (a.error.empty() && a.value.isArray()) {
      for (auto v : a.value.getArray()) paths.push_back(string_of(v));
    }
    return paths.size() >= 2;
  })) << "no operations rendered; the page says: "
      << browser.text("body").value_or("(nothing)");
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/greeting/{name}"), paths.end());
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/services/myservice/ping"), paths.end());
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/openapi.json"), paths.end());
  // The title and the summaries come from the document.
  EXPECT_EQ(browser.text(".info .title").value_or("").substr(0, 8), "Greeting");
  std::vector<std::string> summaries = browser.texts(".opblock-summary-description");
  EXPECT_NE(std::find(summaries.begin(), summaries.end(), "Greets `name`"), summaries.end())
      << "summaries: " << absl::StrJoin(summaries, " | ");
  finish();
}
