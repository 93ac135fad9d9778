// The shared-memory side of a scheduler graph (scheduler/graphs/*.graph), read as text: its smem
// capacity and each buffer's slot bytes, for tests that hold a graph to the kernel it models.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace fa4_test {

struct SmemModel {
  int64_t capacity = -1;
  std::map<std::string, int64_t> slot;  // buffer name -> slot bytes
};

// The `capacity smem` and `buffer NAME smem BYTES` lines of a graph.
inline SmemModel read_model(const std::string& graph) {
  const std::string path = std::string(FA4_SOURCE_DIR) + "/scheduler/graphs/" + graph + ".graph";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  SmemModel m;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key, name, pool;
    int64_t bytes = 0;
    ls >> key;
    if (key == "capacity" && (ls >> name >> bytes) && name == "smem") m.capacity = bytes;
    if (key == "buffer" && (ls >> name >> pool >> bytes) && pool == "smem") m.slot[name] = bytes;
  }
  return m;
}

}  // namespace fa4_test
