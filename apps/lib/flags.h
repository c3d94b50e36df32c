// Command-line flags: each app declares its flags with a default and a help line; `--help` prints them
// (grouped under headings, wrapped to 100 columns), `--version` prints "tinytrain <version>", `--config
// FILE` reads "name = value" lines (command line wins; quotes around a value are dropped; '#' after a space
// or at a line's start begins a comment), and anything unknown or malformed is a one-line
// error. Switches are on/off: `--name`, `--no-name`, `--name=on|off` or `--name on|off`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tt::app {

class Flags {
 public:
  Flags(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  // Declares a flag taking a value (`--name VALUE` or `--name=VALUE`). `choices`, when given, are shown in
  // the help line in place of VALUE (e.g. "f32|bf16"); the flag's reader still checks the value.
  void add(const std::string& name, const std::string& default_value, const std::string& help,
           const std::vector<std::string>& choices = {});
  // Declares an on/off switch, off unless `on_by_default`: `--name` or `--name on` turns it on, `--no-name`
  // or `--name off` turns it off (also `--name=on|off`, true|false, yes|no, 1|0).
  void add_switch(const std::string& name, const std::string& help, bool on_by_default = false);
  // Another spelling of a declared flag (an older name, say), accepted everywhere and shown in its help.
  void alias(const std::string& other_name, const std::string& name);
  // The help heading of the flags declared after this call ("model", "data", ...); --help lists each
  // heading once, in the order headings first appear, with its flags in declaration order.
  void group(const std::string& heading) { group_ = heading; }

  // Returns false when --help or --version was given (after printing the help text or the version).
  bool parse(int argc, char** argv);

  std::string str(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  bool boolean(const std::string& name) const;
  std::vector<std::string> list(const std::string& name) const;  // comma-separated
  std::vector<int64_t> int_list(const std::string& name) const;
  std::vector<double> number_list(const std::string& name) const;
  bool given(const std::string& name) const;  // set on the command line or in the config file
  bool declared(const std::string& name) const { return specs_.count(name) > 0; }
  // The values `add` listed for the flag (empty: any); "cuda:N" stands for a pattern.
  const std::vector<std::string>& choices(const std::string& name) const;
  const std::string& default_value(const std::string& name) const;  // as `add` declared it
  std::string help() const;                                         // lines of at most 100 columns
  // Every declared flag as ("--name", value), in declaration order.
  std::vector<std::pair<std::string, std::string>> values() const;

 private:
  struct Spec {
    std::string default_value, help;
    bool is_switch = false;
    std::vector<std::string> choices;
    std::string group;
    std::vector<std::string> aliases;
  };
  std::string canonical(const std::string& name) const;  // an alias's flag; any other name unchanged
  void set(const std::string& name, const std::string& value, const std::string& origin);
  void read_config(const std::string& path);
  std::string program_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> aliases_;  // alias -> flag
  std::string group_;
};

// "tinytrain <version>" and, where the build knew it, " (git <commit>)".
std::string version_line();

}  // namespace tt::app
