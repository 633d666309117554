// Fixed pool of KV-cache blocks with reference counts and an LRU free queue.
// Mirrors engine/core/page_allocator.py exactly; the GIL is released inside every call.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

class PageAllocator {
 public:
  explicit PageAllocator(int num_blocks) {
    if (num_blocks < 1) throw std::invalid_argument("num_blocks must be >= 1, got " + std::to_string(num_blocks));
    n_ = num_blocks;
    ref_.assign(n_, 0);
    prev_.assign(n_, -1);
    next_.assign(n_, -1);
    in_queue_.assign(n_, true);
    for (int b = 0; b < n_; ++b) {
      prev_[b] = b - 1;
      next_[b] = b + 1 < n_ ? b + 1 : -1;
    }
    head_ = 0;
    tail_ = n_ - 1;
    free_ = n_;
  }

  int capacity() const { return n_; }
  int num_free() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_;
  }

  // n blocks from the head of the free queue (least recently freed first), or none at all.
  std::optional<std::vector<int>> allocate(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (n < 0) throw std::invalid_argument("cannot allocate a negative number of blocks: " + std::to_string(n));
    if (n > free_) return std::nullopt;
    std::vector<int> out;
    out.reserve(n);
    for (int i = 0; i < n; ++i) {
      int b = head_;
      unlink(b);
      ref_[b] = 1;
      out.push_back(b);
    }
    return out;
  }

  // Takes one specific free block out of the queue (a prefix-cache hit on an evictable block).
  void take(int b) {
    std::lock_guard<std::mutex> lock(mu_);
    check(b);
    if (!in_queue_[b]) throw std::invalid_argument("block " + std::to_string(b) + " is not free");
    unlink(b);
    ref_[b] = 1;
  }

  int incref(int b) {
    std::lock_guard<std::mutex> lock(mu_);
    check(b);
    if (ref_[b] == 0) throw std::invalid_argument("cannot incref free block " + std::to_string(b));
    return ++ref_[b];
  }

  // Drops one reference; the block returns to the tail of the free queue at zero.
  bool free(int b) {
    std::lock_guard<std::mutex> lock(mu_);
    check(b);
    if (ref_[b] == 0) throw std::invalid_argument("double free of block " + std::to_string(b));
    if (--ref_[b] > 0) return false;
    push_tail(b);
    return true;
  }

  int refcount(int b) {
    std::lock_guard<std::mutex> lock(mu_);
    check(b);
    return ref_[b];
  }

  bool is_free(int b) {
    std::lock_guard<std::mutex> lock(mu_);
    check(b);
    return in_queue_[b];
  }

  std::vector<int> free_queue() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> out;
    for (int b = head_; b != -1; b = next_[b]) out.push_back(b);
    return out;
  }

 private:
  void check(int b) const {
    if (b < 0 || b >= n_)
      throw std::invalid_argument("block id " + std::to_string(b) + " out of range [0, " + std::to_string(n_) + ")");
  }
  void unlink(int b) {
    if (prev_[b] != -1) next_[prev_[b]] = next_[b]; else head_ = next_[b];
    if (next_[b] != -1) prev_[next_[b]] = prev_[b]; else tail_ = prev_[b];
    prev_[b] = next_[b] = -1;
    in_queue_[b] = false;
    --free_;
  }
  void push_tail(int b) {
    prev_[b] = tail_;
    next_[b] = -1;
    if (tail_ != -1) next_[tail_] = b; else head_ = b;
    tail_ = b;
    in_queue_[b] = true;
    ++free_;
  }

  int n_, head_, tail_, free_;
  std::vector<int> ref_, prev_, next_;
  std::vector<bool> in_queue_;
  std::mutex mu_;
};

PYBIND11_MODULE(_page_allocator, m) {
  m.doc() = "Native KV-cache page allocator";
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<PageAllocator>(m, "PageAllocator")
      .def(py::init<int>(), py::arg("num_blocks"))
      .def_property_readonly("capacity", &PageAllocator::capacity)
      .def_property_readonly("num_free", py::cpp_function(&PageAllocator::num_free, release()))
      .def("allocate", &PageAllocator::allocate, py::arg("n"), release())
      .def("take", &PageAllocator::take, py::arg("block_id"), release())
      .def("incref", &PageAllocator::incref, py::arg("block_id"), release())
      .def("free", &PageAllocator::free, py::arg("block_id"), release())
      .def("refcount", &PageAllocator::refcount, py::arg("block_id"), release())
      .def("is_free", &PageAllocator::is_free, py::arg("block_id"), release())
      .def("free_queue", &PageAllocator::free_queue, release());
}
