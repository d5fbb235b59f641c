// Certificates made at test time with the openssl command-line tool, in a scratch folder that
// goes with the object.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace pki_test {

class Pki {
 public:
  Pki() {
    char pattern[] = "/tmp/bus-pki-XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }
  ~Pki() { std::filesystem::remove_all(dir_); }
  Pki(const Pki&) = delete;
  Pki& operator=(const Pki&) = delete;

  const std::string& dir() const { return dir_; }
  std::string pem(const std::string& name) const { return dir_ + "/" + name + ".pem"; }
  std::string key(const std::string& name) const { return dir_ + "/" + name + ".key"; }

  /// A CA named `name` (P-256).
  void ca(const std::string& name) {
    run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -keyout " +
        key(name) + " -out " + pem(name) + " -subj '/CN=" + name +
        "' -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign");
  }

  struct Leaf {
    std::string cn = "localhost";
    std::string issuer;  // a CA made by ca(); empty: self-signed
    std::string san = "DNS:localhost,IP:127.0.0.1";
    bool client = false;  // for a client (mTLS) rather than a server
    bool expired = false;
    bool rsa = false;  // RSA 2048 rather than P-256
  };
  /// A certificate and its key, `name`.pem and `name`.key.
  void leaf(const std::string& name, const Leaf& l) {
    std::string algorithm =
        l.rsa ? "-newkey rsa:2048" : "-newkey ec -pkeyopt ec_paramgen_curve:P-256";
    std::string ext = dir_ + "/" + name + ".ext";
    std::ofstream(ext) << "subjectAltName=" << l.san
                       << "\nextendedKeyUsage=" << (l.client ? "clientAuth" : "serverAuth") << "\n";
    std::string days = l.expired ? "-1" : "30";  // -1: it ended a day before it began
    if (l.issuer.empty()) {
      run("openssl req -x509 " + algorithm + " -nodes -days " + days + " -keyout " + key(name) +
          " -out " + pem(name) + " -subj '/CN=" + l.cn + "' -addext subjectAltName=" + l.san);
      return;
    }
    std::string csr = dir_ + "/" + name + ".csr";
    run("openssl req -new " + algorithm + " -nodes -keyout " + key(name) + " -out " + csr +
        " -subj '/CN=" + l.cn + "'");
    run("openssl x509 -req -in " + csr + " -CA " + pem(l.issuer) + " -CAkey " + key(l.issuer) +
        " -CAcreateserial -days " + days + " -extfile " + ext + " -out " + pem(name));
  }

  /// Runs a shell command quietly; a failure fails the test that asked for it.
  static void run(const std::string& command) {
    int rc = std::system((command + " >/dev/null 2>&1").c_str());
    ASSERT_EQ(rc, 0) << command;
  }

 private:
  std::string dir_;
};

/// What a command printed (stdout and stderr together) and its exit code (-1: it did not exit).
struct Output {
  int exit = -1;
  std::string text;
};
inline Output capture(const std::string& command) {
  Output out;
  FILE* p = ::popen(("timeout 60 " + command + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.text.append(buf, n);
  int status = ::pclose(p);
  if (WIFEXITED(status)) out.exit = WEXITSTATUS(status);
  return out;
}

}  // namespace pki_test
