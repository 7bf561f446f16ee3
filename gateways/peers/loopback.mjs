// Preloaded into @modelcontextprotocol/server-everything (`node --import`): its streamable-HTTP
// server calls `app.listen(PORT, callback)`, which binds every interface. The suite keeps to
// loopback, so a listen given only a port and a callback binds 127.0.0.1 instead.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (args.length === 2 && typeof args[1] === "function") {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
