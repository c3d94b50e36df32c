// Command-line flags: each app declares its flags with a default and a help line; `--help` prints them,
// `--config FILE` reads "name = value" lines (command line wins), and anything unknown or malformed is a
// one-line error.
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

  // Declares a flag taking a value (`--name VALUE` or `--name=VALUE`).
  void add(const std::string& name, const std::string& default_value, const std::string& help);
  // Declares a boolean switch (`--name`, or `--name=true|false`).
  void add_switch(const std::string& name, const std::string& help);

  // Returns false when --help was given (after printing the help text).
  bool parse(int argc, char** argv);

  std::string str(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  bool boolean(const std::string& name) const;
  std::vector<std::string> list(const std::string& name) const;  // comma-separated
  std::vector<int64_t> int_list(const std::string& name) const;
  std::vector<double> number_list(const std::string& name) const;
  bool given(const std::string& name) const;
  bool declared(const std::string& name) const {
    return specs_.count(name) > 0;
  }  // set on the command line or in the config file
  std::string help() const;
  // Every declared flag as ("--name", value), in declaration order.
  std::vector<std::pair<std::string, std::string>> values() const;
  // All flags as "--name value" pairs (what a checkpoint records).
  std::string summary_line() const;

 private:
  struct Spec {
    std::string default_value, help;
    bool is_switch = false;
  };
  void set(const std::string& name, const std::string& value, const std::string& origin);
  void read_config(const std::string& path);
  std::string program_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::string> values_;
};

}  // namespace tt::app
