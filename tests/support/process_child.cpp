// The child of process_test (util/process.h): writes its arguments after the first three to
// OUT_FILE, one per line, sleeps SLEEP_MS, and exits with EXIT_CODE.
//   process_child OUT_FILE SLEEP_MS EXIT_CODE [ARG...]
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  {
    std::ofstream out(argv[1], std::ios::binary | std::ios::trunc);
    for (int i = 4; i < argc; ++i) out << argv[i] << '\n';
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[2])));
  return std::atoi(argv[3]);
}
