// Turns a CUDA source into C++ for cuda_emu.h: usage `translate IN.cu OUT.cc`.
//   kernel<<<grid, block[, shared[, stream]]>>>(args)
//     -> ::cleave::cuda_emu::Launch("kernel", Bind([](auto... a) { kernel(a...); }, args),
//                                   grid, block[, ...])
//        (Bind copies the arguments now, as a launch passes them by value)
//   extern __shared__ T name[];
//     -> T* name = ::cleave::cuda_emu::DynamicShared<T>();
// Line breaks are kept, and a #line directive names the source, so compiler messages and
// fault reports point into the .cu file.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>

namespace {

bool IsIdent(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }

// Start of the kernel expression that ends just before `end`: a name, perhaps qualified,
// perhaps with template arguments.
size_t KernelStart(const std::string& s, size_t end) {
  size_t i = end;
  while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1]))) --i;
  if (i > 0 && s[i - 1] == '>') {
    int depth = 0;
    while (i > 0) {
      const char c = s[--i];
      if (c == '>') ++depth;
      if (c == '<' && --depth == 0) break;
    }
  }
  while (i > 0 && IsIdent(s[i - 1])) --i;
  return i;
}

// Index of the ')' matching the '(' at `open`.
size_t MatchParen(const std::string& s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')' && --depth == 0) return i;
  }
  return std::string::npos;
}

bool Translate(const std::string& in, std::string* out, std::string* error) {
  static const std::regex dynamic_shared(R"(extern\s+__shared__\s+([A-Za-z_][\w:]*)\s+(\w+)\s*\[\s*\]\s*;)");
  const std::string s = std::regex_replace(in, dynamic_shared, "$1* $2 = ::cleave::cuda_emu::DynamicShared<$1>();");
  std::string r;
  size_t done = 0;
  for (size_t at = s.find("<<<"); at != std::string::npos; at = s.find("<<<", done)) {
    const size_t start = KernelStart(s, at);
    const size_t close = s.find(">>>", at);
    if (start == at || close == std::string::npos) {
      *error = "a launch without a kernel name or without >>> at offset " + std::to_string(at);
      return false;
    }
    size_t open = close + 3;
    while (open < s.size() && std::isspace(static_cast<unsigned char>(s[open]))) ++open;
    const size_t end = open < s.size() && s[open] == '(' ? MatchParen(s, open) : std::string::npos;
    if (end == std::string::npos) {
      *error = "a launch without its argument list at offset " + std::to_string(at);
      return false;
    }
    std::string kernel = s.substr(start, at - start);
    while (!kernel.empty() && std::isspace(static_cast<unsigned char>(kernel.back()))) kernel.pop_back();
    r += s.substr(done, start - done);
    // An empty argument list binds none.
    const std::string args = s.substr(open + 1, end - open - 1);
    const bool none = args.find_first_not_of(" \t\r\n") == std::string::npos;
    r += "::cleave::cuda_emu::Launch(\"" + kernel + "\", ::cleave::cuda_emu::Bind([](auto... a) { " + kernel +
         "(a...); }" + (none ? "" : ", ") + args + "), " + s.substr(at + 3, close - at - 3) + ")";
    done = end + 1;
  }
  r += s.substr(done);
  *out = std::move(r);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: translate IN.cu OUT.cc\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::cerr << "translate: cannot read " << argv[1] << "\n";
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  std::string out, error;
  if (!Translate(text.str(), &out, &error)) {
    std::cerr << "translate: " << argv[1] << ": " << error << "\n";
    return 1;
  }
  std::ofstream o(argv[2], std::ios::binary | std::ios::trunc);
  o << "#line 1 \"" << argv[1] << "\"\n" << out;
  if (!o) {
    std::cerr << "translate: cannot write " << argv[2] << "\n";
    return 1;
  }
  return 0;
}
