// rdx: a dma-buf file descriptor, owned or borrowed, for registering memory
// another driver exported (a GPU, an accelerator, udmabuf, DRM's vgem). The
// registration itself is memory_region's (verbs/memory_region.hpp).
#pragma once

#include <rdx/error.hpp>

#include <cerrno>
#include <cstddef>
#include <string>
#include <utility>

#include <sys/types.h>
#include <unistd.h>

namespace rdx {

//! A dma-buf file descriptor. own() closes it once, when the last owner goes;
//! borrow() never closes it (the caller keeps it open at least until the
//! registration is made; the registration holds its own reference to the
//! dma-buf after that). Move-only.
class dma_buf {
public:
  //! Takes ownership of fd. @throws rdx::error (errc::invalid_argument) for fd < 0.
  [[nodiscard]] static dma_buf own(int fd) { return dma_buf(checked(fd, "dma_buf::own"), true); }
  //! Uses fd without owning it. @throws rdx::error (errc::invalid_argument) for fd < 0.
  [[nodiscard]] static dma_buf borrow(int fd) { return dma_buf(checked(fd, "dma_buf::borrow"), false); }

  //! Takes o's descriptor and whether it is owned; o is left without one.
  dma_buf(dma_buf&& o) noexcept : fd_(std::exchange(o.fd_, -1)), owned_(o.owned_) {}
  //! Closes this descriptor if owned, then takes o's; o is left without one.
  dma_buf& operator=(dma_buf&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
      owned_ = o.owned_;
    }
    return *this;
  }
  dma_buf(const dma_buf&) = delete;
  dma_buf& operator=(const dma_buf&) = delete;
  ~dma_buf() { reset(); }

  //! The descriptor (-1 when moved from or released).
  [[nodiscard]] int fd() const noexcept { return fd_; }
  //! The descriptor, as fd().
  [[nodiscard]] int native_handle() const noexcept { return fd_; }
  //! True when made by own(): this object closes the descriptor.
  [[nodiscard]] bool owned() const noexcept { return owned_; }
  //! Gives up the descriptor (and, if owned, the duty to close it).
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

  //! Bytes the dma-buf holds (dma-bufs report their size to lseek(SEEK_END)).
  //! @throws rdx::error when the descriptor is not a dma-buf that says.
  [[nodiscard]] std::size_t size() const {
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    if (end < 0) {
      const int e = errno;
      throw error(std::error_code(e, std::generic_category()),
                  "dma_buf::size: lseek(SEEK_END) on fd " + std::to_string(fd_) + " (is it a dma-buf?)");
    }
    (void)::lseek(fd_, 0, SEEK_SET);
    return static_cast<std::size_t>(end);
  }

private:
  dma_buf(int fd, bool owned) noexcept : fd_(fd), owned_(owned) {}
  static int checked(int fd, const char* who) {
    if (fd < 0) {
      detail::throw_rdx(errc::invalid_argument, std::string(who) + ": fd " + std::to_string(fd));
    }
    return fd;
  }
  void reset() noexcept {
    if (owned_ && fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = -1;
  }
  int fd_ = -1;
  bool owned_ = false;
};

}  // namespace rdx
