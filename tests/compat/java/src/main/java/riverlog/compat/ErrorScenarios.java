// Scenarios of TLS and bad input: the client over TLS trusting the test's CA (and refusing a
// server it does not trust), and the errors it reports for a wrong password, an unknown
// stream, a missing permission and a message larger than the negotiated frame_max. Each
// error is returned as {"error": class, "code": protocol code} for the test to compare with
// what RabbitMQ answers.
package riverlog.compat;

import com.google.gson.JsonObject;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Message;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import io.netty.handler.ssl.SslContextBuilder;
import io.netty.handler.ssl.SslHandler;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;

final class ErrorScenarios {

  private ErrorScenarios() {}

  static void register(Map<String, Scenario.Run> scenarios) {
    scenarios.put("tls", ErrorScenarios::tls);
    scenarios.put("bad_input", ErrorScenarios::badInput);
  }

  /**
   * Over TLS (the argument's port is the TLS port, tls_ca the CA): create, 20 messages,
   * read back, delete. Then an environment trusting only the JDK's CAs. Result: {"confirmed",
   * "bodies", "addresses", "untrusted": error, "untrusted_handshakes": [the class names of
   * each TLS handshake's failure and its causes]}. The handshakes are recorded from Netty's
   * SslHandler because the error build() reports races with the channel's close: the
   * client's first write may fail with a ClosedChannelException before the handshake's own
   * SSLHandshakeException reaches it.
   */
  static JsonObject tls(Harness h) throws Exception {
    String stream = h.str("stream");
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator().stream(stream).create();
      Producer producer = env.producerBuilder().stream(stream).build();
      out.addProperty(
          "confirmed", Flow.sendAll(producer, Flow.plain(producer, "m", 0, 20), 30).confirmed.size());
      out.add(
          "bodies",
          Harness.json(Flow.read(env, stream, OffsetSpecification.first(), 20).bodies()));
      producer.close();
      env.deleteStream(stream);
    }
    out.add("addresses", Harness.json(h.resolvedSince(0)));
    var untrusted = h.builder();
    untrusted.tls().sslContext(SslContextBuilder.forClient().build());
    List<List<String>> handshakes = Collections.synchronizedList(new ArrayList<>());
    untrusted.netty().channelCustomizer(channel -> {
      SslHandler ssl = channel.pipeline().get(SslHandler.class);
      if (ssl != null) {
        ssl.handshakeFuture().addListener(done -> handshakes.add(
            done.isSuccess() ? List.of("ok") : Harness.classNames(done.cause())));
      }
    });
    out.add("untrusted", Harness.attempt(() -> untrusted.build()));
    out.add("untrusted_handshakes", Harness.json(handshakes));
    return out;
  }

  /**
   * Against a server with users and authorization (the argument's "users": {name: password},
   * "admin" may do everything, "writer" publish to orders.*, "reader" consume orders.* and do
   * everything on reader.*). Result: one entry per attempt, {"ok": true} or its error.
   */
  static JsonObject badInput(Harness h) {
    JsonObject out = new JsonObject();
    JsonObject users = h.args.getAsJsonObject("users");
    String stream = h.str("stream");
    out.add(
        "wrong_password",
        Harness.attempt(() -> h.builder().username("writer").password("not-the-password").build()));
    out.add("unknown_user", Harness.attempt(() -> h.builder().username("nobody").password("x").build()));
    try (Environment admin = as(h, users, "admin");
        Environment writer = as(h, users, "writer");
        Environment reader = as(h, users, "reader")) {
      admin.streamCreator().stream(stream).create();
      Producer adminProducer = admin.producerBuilder().stream(stream).build();
      Flow.sendAll(adminProducer, Flow.plain(adminProducer, "m", 0, 10), 30);

      String missing = "no-such-" + stream;
      out.add("unknown_producer", Harness.attempt(() -> admin.producerBuilder().stream(missing).build()));
      out.add("unknown_consumer", Harness.attempt(() -> consumer(admin, missing)));
      out.add("unknown_stats", Harness.attempt(() -> admin.queryStreamStats(missing)));
      out.add("unknown_delete", Harness.attempt(() -> admin.deleteStream(missing)));
      out.addProperty("unknown_exists", admin.streamExists(missing));

      out.add(
          "writer_create",
          Harness.attempt(() -> writer.streamCreator().stream("orders.other-" + stream).create()));
      out.add("writer_consume", Harness.attempt(() -> consumer(writer, stream)));
      out.add("writer_delete", Harness.attempt(() -> writer.deleteStream(stream)));
      out.add("writer_stats", Harness.attempt(() -> writer.queryStreamStats(stream)));
      out.add(
          "writer_publish",
          Harness.attempt(
              () -> {
                Producer p = writer.producerBuilder().stream(stream).build();
                Flow.Sent sent = Flow.sendAll(p, Flow.plain(p, "w", 0, 1), 30);
                p.close();
                return sent.json();
              }));
      out.add("reader_publish", Harness.attempt(() -> reader.producerBuilder().stream(stream).build()));
      Flow.Received got = new Flow.Received();
      out.add(
          "reader_consume",
          Harness.attempt(
              () -> {
                Consumer c =
                    reader
                        .consumerBuilder()
                        .stream(stream)
                        .offset(OffsetSpecification.first())
                        .messageHandler(got)
                        .build();
                got.waitFor(11, 30, 300);
                c.close();
                return got.json();
              }));
      String own = "reader.own-" + stream;
      out.add("reader_create_own", Harness.attempt(() -> reader.streamCreator().stream(own).create()));
      out.add("reader_delete_own", Harness.attempt(() -> reader.deleteStream(own)));

      // frame_max: RabbitMQ proposes 1,048,576 bytes; the client refuses a larger message
      // before sending it, and one that fits goes through whole
      out.add("too_large", Harness.attempt(() -> sendOne(adminProducer, 1_100_000)));
      out.add("fits", Harness.attempt(() -> sendOne(adminProducer, 1_000_000)));
      Flow.Received big = Flow.read(admin, stream, OffsetSpecification.offset(10), 2);
      out.add("after_large", Harness.json(big.bodies().stream().map(String::length).toArray()));
      adminProducer.close();
      admin.deleteStream(stream);
    }
    return out;
  }

  private static Environment as(Harness h, JsonObject users, String user) {
    return h.builder().username(user).password(users.get(user).getAsString()).build();
  }

  private static Consumer consumer(Environment env, String stream) {
    return env.consumerBuilder()
        .stream(stream)
        .offset(OffsetSpecification.first())
        .messageHandler((context, message) -> {})
        .build();
  }

  private static JsonObject sendOne(Producer producer, int size) {
    byte[] body = new byte[size];
    Arrays.fill(body, (byte) 'b');
    Message message = producer.messageBuilder().addData(body).build();
    return Flow.sendAll(producer, List.of(message), 30).json();
  }
}
