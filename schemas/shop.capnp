# The compose example (examples/compose): a quote service that asks a price service and a stock
# service at once and answers with what it got under one deadline.
@0xdf75f3b88bce3a1f;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("shop");

struct ItemRequest {
  item @0 :Text;  # from the path: GET /quote/{item}
}

struct Price {
  item @0 :Text;
  cents @1 :UInt32;
}

struct Stock {
  item @0 :Text;
  available @1 :UInt32;
}

# The combined answer. A part that failed or missed the deadline stays 0 and its status says
# why, so a slow stock service costs the stock figure, not the whole quote.
struct Quote {
  item @0 :Text;
  priceCents @1 :UInt32;
  available @2 :UInt32;
  priceStatus @3 :Text;  # "ok", or the failure (e.g. "DEADLINE_EXCEEDED: ...")
  stockStatus @4 :Text;
}
