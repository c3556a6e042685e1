// Producer scenarios: confirms (with AMQP 1.0 properties read back), deduplication with a
// named producer and getLastPublishingId, and sub-entry batching with every compression codec
// of both codec factories the client offers. Each creates its stream (the argument's
// "stream" as a prefix) and deletes it at the end.
package riverlog.compat;

import com.google.gson.JsonObject;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Message;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import com.rabbitmq.stream.compression.CommonsCompressCompressionCodecFactory;
import com.rabbitmq.stream.compression.Compression;
import com.rabbitmq.stream.compression.CompressionCodecFactory;
import com.rabbitmq.stream.compression.DefaultCompressionCodecFactory;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

final class ProducerScenarios {

  private ProducerScenarios() {}

  static void register(Map<String, Scenario.Run> scenarios) {
    scenarios.put("confirms", ProducerScenarios::confirms);
    scenarios.put("dedup", ProducerScenarios::dedup);
    scenarios.put("compression", ProducerScenarios::compression);
  }

  /** What the test compares of a message: body, properties, application properties, annotations. */
  static Map<String, String> describe(Message m) {
    Map<String, String> out = new TreeMap<>();
    out.put("body", Harness.text(m.getBodyAsBinary()));
    if (m.getProperties() != null) {
      out.put("message_id", String.valueOf(m.getProperties().getMessageId()));
      out.put("correlation_id", String.valueOf(m.getProperties().getCorrelationId()));
      out.put("content_type", String.valueOf(m.getProperties().getContentType()));
      out.put("subject", String.valueOf(m.getProperties().getSubject()));
      out.put("creation_time", String.valueOf(m.getProperties().getCreationTime()));
    }
    if (m.getApplicationProperties() != null) {
      m.getApplicationProperties().forEach((k, v) -> out.put("app." + k, stringOf(v)));
    }
    if (m.getMessageAnnotations() != null) {
      m.getMessageAnnotations().forEach((k, v) -> out.put("ann." + k, stringOf(v)));
    }
    return out;
  }

  private static String stringOf(Object value) {
    if (value instanceof byte[]) {
      return "bytes:" + Harness.text((byte[]) value);
    }
    return value.getClass().getSimpleName() + ":" + value;
  }

  /**
   * ``count`` messages (every tenth with AMQP properties, application properties and message
   * annotations), each confirmed; then read back from the first offset.
   * Result: {"confirmed", "failed_codes", "sent": [described], "received": [described],
   * "offsets": [...]}.
   */
  static JsonObject confirms(Harness h) {
    String stream = h.str("stream");
    int count = h.integer("count", 1000);
    try (Environment env = h.environment()) {
      env.streamCreator().stream(stream).create();
      Producer producer = env.producerBuilder().stream(stream).build();
      List<Message> messages = new ArrayList<>();
      for (int i = 0; i < count; i++) {
        if (i % 10 == 0) {
          messages.add(
              producer
                  .messageBuilder()
                  .addData(Harness.body("rich", i))
                  .properties()
                  .messageId("id-" + i)
                  .correlationId((long) i)
                  .contentType("text/plain")
                  .subject("subject-" + i)
                  .creationTime(1_700_000_000_000L + i)
                  .messageBuilder()
                  .applicationProperties()
                  .entry("index", i)
                  .entry("name", "n-" + i)
                  .entry("flag", i % 20 == 0)
                  .entry("big", 1L << 40)
                  .entry("raw", Harness.body("raw", i))
                  .messageBuilder()
                  .messageAnnotations()
                  .entry("x-origin", "java")
                  .messageBuilder()
                  .build());
        } else {
          messages.add(producer.messageBuilder().addData(Harness.body("plain", i)).build());
        }
      }
      Flow.Sent sent = Flow.sendAll(producer, messages, 60);
      producer.close();
      List<Map<String, String>> received = new ArrayList<>();
      List<Long> offsets = new ArrayList<>();
      var consumer =
          env.consumerBuilder()
              .stream(stream)
              .offset(OffsetSpecification.first())
              .messageHandler(
                  (context, message) -> {
                    synchronized (received) {
                      received.add(describe(message));
                      offsets.add(context.offset());
                    }
                  })
              .build();
      Harness.until(
          () -> {
            synchronized (received) {
              return received.size() >= count;
            }
          },
          60,
          count + " messages back");
      Harness.sleep(200);
      consumer.close();
      env.deleteStream(stream);
      JsonObject out = sent.json();
      List<Map<String, String>> described = new ArrayList<>();
      messages.forEach(m -> described.add(describe(m)));
      synchronized (received) {
        out.add("sent", Harness.json(described));
        out.add("received", Harness.json(received));
        out.add("offsets", Harness.json(offsets));
      }
      return out;
    }
  }

  /**
   * A named producer sends 10 messages (ids the client picks); a new producer of that name
   * reads getLastPublishingId, then sends ids last-4 .. last+5 (5 duplicates, 5 new); a
   * producer of another name sends id 0. Result: {"last_before_first", "first": {confirmed,
   * failed_codes}, "last_after_first",
   * "second": {confirmed...}, "last_after_second", "other_name_confirmed", "bodies"}.
   */
  static JsonObject dedup(Harness h) {
    String stream = h.str("stream");
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator().stream(stream).create();
      Producer first = env.producerBuilder().stream(stream).name("app").build();
      out.addProperty("last_before_first", first.getLastPublishingId());
      out.add("first", Flow.sendAll(first, Flow.plain(first, "first", 0, 10), 30).json());
      first.close();
      Producer second = env.producerBuilder().stream(stream).name("app").build();
      long last = second.getLastPublishingId();
      out.addProperty("last_after_first", last);
      List<Message> again = new ArrayList<>();
      for (long id = last - 4; id <= last + 5; id++) {
        again.add(
            second.messageBuilder().publishingId(id).addData(Harness.body("second", id)).build());
      }
      out.add("second", Flow.sendAll(second, again, 30).json());
      second.close();
      Producer third = env.producerBuilder().stream(stream).name("app").build();
      out.addProperty("last_after_second", third.getLastPublishingId());
      third.close();
      Producer other = env.producerBuilder().stream(stream).name("other").build();
      Flow.Sent otherSent =
          Flow.sendAll(
              other,
              List.of(other.messageBuilder().publishingId(0).addData("other-0".getBytes()).build()),
              30);
      out.addProperty("other_name_confirmed", otherSent.confirmed.size());
      other.close();
      Flow.Received got = Flow.read(env, stream, OffsetSpecification.first(), 16);
      env.deleteStream(stream);
      out.add("bodies", Harness.json(got.bodies()));
      out.add("offsets", Harness.json(got.offsets()));
    }
    return out;
  }

  /**
   * For each codec factory (the default one: JDK gzip, xerial snappy, lz4-java, zstd-jni;
   * commons-compress) and each Compression, a producer with subEntrySize 10 sends ``count``
   * messages; they are read back from the first offset. Each stream, "<stream>-FACTORY-CODEC",
   * is deleted unless the argument has "keep". Result: {"FACTORY/CODEC": {confirmed,
   * failed_codes, bodies, offsets}}.
   */
  static JsonObject compression(Harness h) {
    int count = h.integer("count", 95);
    Map<String, CompressionCodecFactory> factories = new LinkedHashMap<>();
    factories.put("default", new DefaultCompressionCodecFactory());
    factories.put("commons-compress", new CommonsCompressCompressionCodecFactory());
    JsonObject out = new JsonObject();
    for (Map.Entry<String, CompressionCodecFactory> factory : factories.entrySet()) {
      try (Environment env = h.builder().compressionCodecFactory(factory.getValue()).build()) {
        for (Compression compression : Compression.values()) {
          String stream = h.str("stream") + "-" + factory.getKey() + "-" + compression.name();
          env.streamCreator().stream(stream).create();
          Producer producer =
              env.producerBuilder()
                  .stream(stream)
                  .subEntrySize(10)
                  .compression(compression)
                  .build();
          List<Message> messages = new ArrayList<>();
          for (int i = 0; i < count; i++) {
            // repetitive bodies of varying length: every codec really compresses them
            String body = compression.name() + "-" + i + "-" + "abc".repeat(i % 40);
            messages.add(producer.messageBuilder().addData(body.getBytes()).build());
          }
          Flow.Sent sent = Flow.sendAll(producer, messages, 30);
          producer.close();
          Flow.Received got = Flow.read(env, stream, OffsetSpecification.first(), count);
          if (!h.args.has("keep")) {
            env.deleteStream(stream);
          }
          JsonObject result = sent.json();
          result.add("bodies", Harness.json(got.bodies()));
          result.add("offsets", Harness.json(got.offsets()));
          out.add(factory.getKey() + "/" + compression.name(), result);
        }
      }
    }
    return out;
  }
}
