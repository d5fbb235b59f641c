// `--help` for the programs we ship (the examples and busctl): their purpose, then their flags.
#pragma once

#include <absl/flags/usage.h>
#include <absl/flags/usage_config.h>
#include <absl/strings/match.h>

namespace examples {

/// Call before absl::ParseCommandLine. Abseil's --help lists only the flags declared in a file
/// named after the program (greeting_server.cc, main.cc), which none of ours is; it would say
/// "No flags matched". Every flag not declared by Abseil itself is the program's.
inline void usage(const char* what) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(what);
}

}  // namespace examples
