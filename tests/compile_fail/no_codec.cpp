// Must not compile: a channel whose type has no codec cannot be bridged.
#include <bus/net/node.hpp>

struct NoCodec {
  int x;
};
inline const bus::Topic<NoCodec> topic{"compile_fail.no_codec"};

void bridge(bus::net::Node& node) { node.export_topic(topic); }
