// What every scenario shares: its JSON argument, an Environment built from it (host, port,
// credentials, TLS trust, short recovery delays, every address the client connects to
// recorded), numbered message bodies, bounded waits, and the event lines a scenario prints
// while it runs. Rules: nothing here asserts; scenarios return what they saw and the pytest
// test decides. A wait that runs out throws, naming what it waited for.
package riverlog.compat;

import com.google.gson.Gson;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.rabbitmq.stream.Address;
import com.rabbitmq.stream.BackOffDelayPolicy;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.EnvironmentBuilder;
import com.rabbitmq.stream.Resource;
import com.rabbitmq.stream.impl.StreamEnvironmentBuilder;
import io.netty.handler.ssl.SslContextBuilder;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;

final class Harness {

  static final Gson GSON = new Gson();
  static final Duration RECOVERY_DELAY = Duration.ofMillis(500);
  private static final BufferedReader STDIN =
      new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));

  final JsonObject args;
  /** "host:port" of every connection the client opened, in order (AddressResolver calls). */
  final List<String> resolved = Collections.synchronizedList(new ArrayList<>());

  Harness(JsonObject args) {
    this.args = args;
  }

  String str(String key) {
    return args.get(key).getAsString();
  }

  String str(String key, String otherwise) {
    return args.has(key) && !args.get(key).isJsonNull() ? args.get(key).getAsString() : otherwise;
  }

  int integer(String key, int otherwise) {
    return args.has(key) ? args.get(key).getAsInt() : otherwise;
  }

  /**
   * An EnvironmentBuilder for the server in the argument (host, port, username, password,
   * vhost; addresses: ["host:port", ...] of several servers instead of host and port;
   * tls_ca: a PEM CA file to trust, which turns TLS on), recovery and topology update
   * retried every 500 ms (the client's defaults are 5 s), every resolved address recorded.
   */
  EnvironmentBuilder builder() {
    StreamEnvironmentBuilder builder = (StreamEnvironmentBuilder) Environment.builder();
    builder
        .host(str("host"))
        .port(args.get("port").getAsInt())
        .username(str("username", "guest"))
        .password(str("password", "guest"))
        .virtualHost(str("vhost", "/"))
        .rpcTimeout(Duration.ofSeconds(10))
        .recoveryBackOffDelayPolicy(BackOffDelayPolicy.fixed(RECOVERY_DELAY))
        .topologyUpdateBackOffDelayPolicy(BackOffDelayPolicy.fixed(RECOVERY_DELAY))
        .addressResolver(this::resolve);
    if (args.has("addresses")) { // several servers: the locator may use any of them
      List<String> uris = new ArrayList<>();
      args.getAsJsonArray("addresses")
          .forEach(
              address ->
                  uris.add(
                      "rabbitmq-stream://"
                          + str("username", "guest")
                          + ":"
                          + str("password", "guest")
                          + "@"
                          + address.getAsString()
                          + "/%2f"));
      builder.uris(uris);
    }
    if (args.has("tls_ca")) {
      try {
        builder
            .tls()
            .sslContext(
                SslContextBuilder.forClient().trustManager(new File(str("tls_ca"))).build());
      } catch (IOException e) {
        throw new IllegalStateException("cannot read the CA " + str("tls_ca"), e);
      }
    }
    return builder;
  }

  Environment environment() {
    return builder().build();
  }

  private Address resolve(Address address) {
    resolved.add(address.host() + ":" + address.port());
    return address;
  }

  /** A copy of the addresses resolved so far, from index ``from`` on. */
  List<String> resolvedSince(int from) {
    synchronized (resolved) {
      return new ArrayList<>(resolved.subList(from, resolved.size()));
    }
  }

  static byte[] body(String prefix, long i) {
    return (prefix + "-" + i).getBytes(StandardCharsets.UTF_8);
  }

  static String text(byte[] body) {
    return new String(body, StandardCharsets.UTF_8);
  }

  static void await(CountDownLatch latch, int seconds, String what) {
    try {
      if (!latch.await(seconds, TimeUnit.SECONDS)) {
        throw new IllegalStateException("timed out after " + seconds + " s waiting for " + what);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }

  static void until(BooleanSupplier condition, int seconds, String what) {
    if (!within(condition, seconds)) {
      throw new IllegalStateException("timed out after " + seconds + " s waiting for " + what);
    }
  }

  /** Poll ``condition`` for ``seconds`` at most; whether it became true. */
  static boolean within(BooleanSupplier condition, int seconds) {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        return false;
      }
      sleep(20);
    }
    return true;
  }

  static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }

  /** Print {"event": name, ...fields} on stdout (the pytest side reads it while we run). */
  static void event(String name, JsonObject fields) {
    JsonObject line = fields.deepCopy();
    line.addProperty("event", name);
    synchronized (System.out) {
      System.out.println(GSON.toJson(line));
      System.out.flush();
    }
  }

  /** The next line the pytest side writes on our stdin (it says what it did). */
  static String command() {
    try {
      String line = STDIN.readLine();
      if (line == null) {
        throw new IllegalStateException("stdin closed while waiting for the test's command");
      }
      return line.trim();
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  /** Records a resource's state changes ("RECOVERING", "OPEN", ...) for the result. */
  static Resource.StateListener stateRecorder(List<String> states) {
    return context -> states.add(context.currentState().name());
  }

  static JsonElement json(Object value) {
    return GSON.toJsonTree(value);
  }

  /** The simple class names of ``e`` and its causes, outermost first (at most 10). */
  static List<String> classNames(Throwable e) {
    List<String> names = new ArrayList<>();
    for (Throwable cause = e; cause != null && names.size() < 10; cause = cause.getCause()) {
      names.add(cause.getClass().getSimpleName());
    }
    return names;
  }

  /**
   * {"error": simple class name, "message", "causes": [class names of the causes], "code":
   * for a StreamException}.
   */
  static JsonObject error(Throwable e) {
    JsonObject out = new JsonObject();
    out.addProperty("error", e.getClass().getSimpleName());
    out.addProperty("message", String.valueOf(e.getMessage()));
    List<String> causes = classNames(e.getCause());
    out.add("causes", json(causes));
    if (e instanceof com.rabbitmq.stream.StreamException) {
      out.addProperty("code", ((com.rabbitmq.stream.StreamException) e).getCode());
    }
    return out;
  }

  /** {"ok": true, "value": ...} or the error (class, message, code) of ``action``. */
  static JsonObject attempt(Supplier<Object> action) {
    try {
      Object value = action.get();
      if (value instanceof AutoCloseable) {
        ((AutoCloseable) value).close();
        value = value.getClass().getSimpleName();
      }
      JsonObject out = new JsonObject();
      out.addProperty("ok", true);
      out.add("value", Harness.json(value == null ? "" : value.toString()));
      if (value instanceof JsonObject) {
        out.add("value", (JsonObject) value);
      }
      return out;
    } catch (Exception e) {
      return Harness.error(e);
    }
  }

  static JsonObject attempt(Runnable action) {
    return attempt(
        () -> {
          action.run();
          return null;
        });
  }
}
