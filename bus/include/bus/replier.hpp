// Replier<Rep>: the answer to one request, for a server that answers later. Part of bus/bus.hpp.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "bus/detail/core.hpp"

namespace bus {

namespace detail {
template <class Rep>
struct Waiter;
template <class Req, class Rep>
struct EndpointTarget;
}  // namespace detail

/// The answer to one request served by Bus::serve_async: call it once, from any thread, with
/// the reply or a status, before the bus goes. Dropped unanswered, it answers Internal.
template <class Rep>
class Replier {
 public:
  Replier(Replier&& o) noexcept
      : send_(std::exchange(o.send_, nullptr)),
        state_(o.state_),
        core_(o.core_),
        reply_to_(o.reply_to_),
        waiter_(std::move(o.waiter_)),
        correlation_(o.correlation_),
        channel_(o.channel_) {}
  Replier& operator=(Replier&&) = delete;
  Replier(const Replier&) = delete;
  ~Replier() {
    if (send_ != nullptr) {
      (*this)(absl::InternalError(absl::StrCat("bus: the handler of '",
                                               detail::channel_info(channel_).name,
                                               "' dropped its reply unanswered")));
    }
  }
  void operator()(absl::StatusOr<Rep> result) {
    if (send_ == nullptr) return;  // answered already
    std::exchange(send_, nullptr)(state_, *core_, reply_to_, waiter_, correlation_,
                                  std::move(result));
  }
  /// False once answered.
  explicit operator bool() const { return send_ != nullptr; }

 private:
  template <class, class>
  friend struct detail::EndpointTarget;
  using Send = void (*)(void*, detail::Core&, detail::Inbox*, std::shared_ptr<detail::Waiter<Rep>>&,
                        uint64_t, absl::StatusOr<Rep>&&);
  Replier(Send send, void* state, detail::Core& core, detail::Inbox* reply_to,
          std::shared_ptr<detail::Waiter<Rep>> waiter, uint64_t correlation, uint32_t channel)
      : send_(send),
        state_(state),
        core_(&core),
        reply_to_(reply_to),
        waiter_(std::move(waiter)),
        correlation_(correlation),
        channel_(channel) {}
  Send send_;
  void* state_;
  detail::Core* core_;
  detail::Inbox* reply_to_;
  std::shared_ptr<detail::Waiter<Rep>> waiter_;
  uint64_t correlation_;
  uint32_t channel_;
};

}  // namespace bus
