// Stream scenarios: create with arguments (max-length-bytes, max-age, max-segment-size) and
// see retention act on them, StreamStats (firstOffset, committedChunkId, committedOffset) on
// an empty and a filled stream, create twice, delete twice.
package riverlog.compat;

import com.google.gson.JsonObject;
import com.rabbitmq.stream.ByteCapacity;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Message;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import com.rabbitmq.stream.StreamStats;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.LongSupplier;

final class StreamScenarios {

  private StreamScenarios() {}

  static void register(Map<String, Scenario.Run> scenarios) {
    scenarios.put("streams", StreamScenarios::streams);
  }

  /**
   * "<stream>-len": max-length-bytes 20 kB, segments of 5 kB, max-age 1 h; its stats empty;
   * 200 messages of 500 bytes in batches of 20 (each confirmed); its stats and what a
   * consumer from "first" gets. "<stream>-age": max-age 2 s, segments of 5 kB; 50 messages,
   * 3 s, 20 more; its first offset. Then both are created again (the same arguments, other
   * arguments) and deleted twice. Result:
   * {"empty": {stat: value or error}, "filled": {...}, "first_read": offset, "last_read",
   * "age_first_offset", "create_again", "exists", "delete_again", "exists_after"}.
   */
  static JsonObject streams(Harness h) {
    String byLength = h.str("stream") + "-len";
    String byAge = h.str("stream") + "-age";
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator()
          .stream(byLength)
          .maxLengthBytes(ByteCapacity.kB(20))
          .maxSegmentSizeBytes(ByteCapacity.kB(5))
          .maxAge(Duration.ofHours(1))
          .create();
      out.add("empty", stats(env, byLength));
      Producer producer = env.producerBuilder().stream(byLength).build();
      for (int batch = 0; batch < 10; batch++) {
        Flow.sendAll(producer, padded(producer, batch * 20, batch * 20 + 20, 500), 30);
      }
      producer.close();
      out.add("filled", stats(env, byLength));
      Flow.Received got = new Flow.Received();
      Consumer consumer =
          env.consumerBuilder()
              .stream(byLength)
              .offset(OffsetSpecification.first())
              .messageHandler(got)
              .build();
      Harness.until(
          () -> got.bodies().stream().anyMatch(b -> b.startsWith("m-199|")),
          30,
          "m-199 from the first offset");
      consumer.close();
      out.addProperty("first_read", got.offsets().get(0));
      out.addProperty("last_read", got.offsets().get(got.size() - 1));

      env.streamCreator()
          .stream(byAge)
          .maxAge(Duration.ofSeconds(2))
          .maxSegmentSizeBytes(ByteCapacity.kB(5))
          .create();
      Producer aged = env.producerBuilder().stream(byAge).build();
      Flow.sendAll(aged, padded(aged, 0, 50, 500), 30);
      Harness.sleep(3000);
      Flow.sendAll(aged, padded(aged, 50, 70, 500), 30);
      aged.close();
      Harness.until(
          () -> env.queryStreamStats(byAge).firstOffset() > 0, 30, "max-age retention");
      out.addProperty("age_first_offset", env.queryStreamStats(byAge).firstOffset());

      // the same arguments: RabbitMQ answers "stream already exists", the client's "done"
      out.add(
          "create_again",
          Harness.attempt(
              () ->
                  env.streamCreator()
                      .stream(byLength)
                      .maxLengthBytes(ByteCapacity.kB(20))
                      .maxSegmentSizeBytes(ByteCapacity.kB(5))
                      .maxAge(Duration.ofHours(1))
                      .create()));
      // other arguments: RabbitMQ answers precondition failed (rabbit_stream_manager:create,
      // rabbit_amqqueue:assert_equivalence), the client throws
      out.add(
          "create_again_other_args",
          Harness.attempt(
              () ->
                  env.streamCreator()
                      .stream(byAge)
                      .maxAge(Duration.ofSeconds(3))
                      .maxSegmentSizeBytes(ByteCapacity.kB(5))
                      .create()));
      out.addProperty("exists", env.streamExists(byLength));
      env.deleteStream(byLength);
      env.deleteStream(byAge);
      out.add("delete_again", Harness.attempt(() -> env.deleteStream(byLength)));
      out.addProperty("exists_after", env.streamExists(byLength));
    }
    return out;
  }

  private static List<Message> padded(Producer producer, int from, int to, int size) {
    List<Message> messages = new ArrayList<>();
    for (int i = from; i < to; i++) {
      StringBuilder body = new StringBuilder("m-" + i + "|");
      while (body.length() < size) {
        body.append('x');
      }
      messages.add(producer.messageBuilder().addData(body.toString().getBytes()).build());
    }
    return messages;
  }

  /** {"first_offset", "committed_chunk_id", "committed_offset"}: a value or the error. */
  static JsonObject stats(Environment env, String stream) {
    StreamStats stats = env.queryStreamStats(stream);
    JsonObject out = new JsonObject();
    out.add("first_offset", value(stats::firstOffset));
    out.add("committed_chunk_id", value(stats::committedChunkId));
    out.add("committed_offset", value(stats::committedOffset));
    return out;
  }

  private static com.google.gson.JsonElement value(LongSupplier supplier) {
    try {
      return Harness.json(supplier.getAsLong());
    } catch (RuntimeException e) {
      return Harness.error(e);
    }
  }
}
