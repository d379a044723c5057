// UTF-8 to UTF-16 for the Win32 side of the platform seam (os_file_win32.cpp,
// process_win32.cpp): the project's strings are UTF-8, the W calls take UTF-16.
#pragma once

#include <windows.h>

#include <string>

namespace expertd::win32 {

inline std::wstring Wide(const std::string& utf8) {
  if (utf8.empty()) return {};
  const int n =
      MultiByteToWideChar(CP_UTF8, 0, utf8.data(), static_cast<int>(utf8.size()), nullptr, 0);
  std::wstring out(static_cast<size_t>(n), L'\0');
  MultiByteToWideChar(CP_UTF8, 0, utf8.data(), static_cast<int>(utf8.size()), out.data(), n);
  return out;
}

}  // namespace expertd::win32
