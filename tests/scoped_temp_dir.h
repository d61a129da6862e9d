// A test's own directory under the system's temporary directory: made empty, and removed with
// everything in it when the test is done, whether it passed or stopped at a failed assertion.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace cleave::testing {

class ScopedTempDir {
 public:
  // `name` and the process id make the directory's name, so that concurrent test processes
  // do not share one.
  explicit ScopedTempDir(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / ("cleave_" + name + "_" + std::to_string(::getpid())))
                  .string()) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ignored;  // a destructor must not throw; a directory left behind is harmless
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace cleave::testing
