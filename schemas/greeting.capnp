# Messages of the greeting example (examples/greeting): the seeds' Quarkus and QBit services.
@0xaf15cf00478918f5;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("greeting");

# GET /greeting/{name}: the path parameter fills `name`.
struct GreetingRequest {
  name @0 :Text;
}

struct Greeting {
  message @0 :Text;   # "Hello Sergio"
}

# GET /services/myservice/ping.
struct PingRequest {}

struct PingReply {
  greetings @0 :List(Text);   # written out as the JSON array ["Hello World!"]
}
