// Super stream scenarios: created and deleted through the client's API (partition count and
// binding keys), producers routing by key hash and by routing key, and single active
// consumers on the super stream spreading its partitions and failing over.
package riverlog.compat;

import com.google.gson.JsonObject;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Message;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

final class SuperStreamScenarios {

  private SuperStreamScenarios() {}

  static final String[] REGIONS = {"amer", "emea", "apac"};

  static void register(Map<String, Scenario.Run> scenarios) {
    scenarios.put("super_streams", SuperStreamScenarios::superStreams);
  }

  /**
   * "<stream>-hash" with 3 partitions and "<stream>-key" with the binding keys amer, emea,
   * apac, both made with streamCreator().superStream(). A hash-routing producer sends 60
   * messages keyed "key-i" (the message id); a key-routing producer sends 30 (region
   * REGIONS[i % 3]) and one to region "nowhere". Two single active consumers "app" on
   * "<stream>-sac" (3 partitions, offset first, automatic tracking) share its partitions;
   * 60 messages "sac-i" (hash routing);
   * the first is closed; 60 more "after-i". Result: {"hash": {partition: [keys]}, "key":
   * {partition: [regions]}, "nowhere": {confirmed, failed_codes}, "sac": {"sac-" |
   * "after-": {"one" | "two": {partition: [bodies]}}}, "exists_after_delete": [bool...]}.
   */
  static JsonObject superStreams(Harness h) {
    String hashed = h.str("stream") + "-hash";
    String keyed = h.str("stream") + "-key";
    String shared = h.str("stream") + "-sac";
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator().name(hashed).superStream().partitions(3).creator().create();
      env.streamCreator().name(keyed).superStream().bindingKeys(REGIONS).creator().create();
      env.streamCreator().name(shared).superStream().partitions(3).creator().create();

      Producer byHash = hashRouting(env, hashed);
      Flow.sendAll(byHash, keyedMessages(byHash, "key", 60), 30);
      out.add("hash", Harness.json(readPartitions(env, hashed, List.of("0", "1", "2"), 60)));

      Producer byKey =
          env.producerBuilder()
              .superStream(keyed)
              .routing(message -> message.getProperties().getMessageIdAsString())
              .key()
              .producerBuilder()
              .build();
      List<Message> regional = new ArrayList<>();
      for (int i = 0; i < 30; i++) {
        regional.add(
            byKey
                .messageBuilder()
                .properties()
                .messageId(REGIONS[i % 3])
                .messageBuilder()
                .addData(Harness.body("r", i))
                .build());
      }
      Flow.sendAll(byKey, regional, 30);
      Message nowhere =
          byKey.messageBuilder().properties().messageId("nowhere").messageBuilder().build();
      out.add("nowhere", Flow.sendAll(byKey, List.of(nowhere), 30).json());
      out.add("key", Harness.json(readPartitions(env, keyed, List.of(REGIONS), 30)));
      byKey.close();

      Flow.Received one = new Flow.Received();
      Flow.Received two = new Flow.Received();
      Consumer first = sac(env, shared, one);
      Consumer second = sac(env, shared, two);
      Producer toShared = hashRouting(env, shared);
      Flow.sendAll(toShared, keyedMessages(toShared, "sac", 60), 30);
      Harness.until(
          () -> count(one, "sac-") + count(two, "sac-") >= 60, 30, "60 messages at the consumers");
      Harness.sleep(500);
      first.close();
      Flow.sendAll(toShared, keyedMessages(toShared, "after", 60), 30);
      Harness.until(() -> count(two, "after-") >= 60, 30, "60 more at the second consumer");
      Harness.sleep(500);
      JsonObject sacOut = new JsonObject();
      for (String prefix : List.of("sac-", "after-")) {
        JsonObject phase = new JsonObject();
        phase.add("one", Harness.json(byPartition(one, prefix)));
        phase.add("two", Harness.json(byPartition(two, prefix)));
        sacOut.add(prefix, phase);
      }
      out.add("sac", sacOut);
      second.close();
      toShared.close();
      byHash.close();

      env.deleteSuperStream(hashed);
      env.deleteSuperStream(keyed);
      env.deleteSuperStream(shared);
      List<Boolean> exists = new ArrayList<>();
      for (String partition : List.of(hashed + "-0", hashed + "-1", hashed + "-2")) {
        exists.add(env.streamExists(partition));
      }
      for (String region : REGIONS) {
        exists.add(env.streamExists(keyed + "-" + region));
      }
      out.add("exists_after_delete", Harness.json(exists));
    }
    return out;
  }

  /** A producer routing by the hash of the message id (the client's default routing). */
  private static Producer hashRouting(Environment env, String superStream) {
    return env.producerBuilder()
        .superStream(superStream)
        .routing(message -> message.getProperties().getMessageIdAsString())
        .producerBuilder()
        .build();
  }

  private static List<Message> keyedMessages(Producer producer, String prefix, int count) {
    List<Message> messages = new ArrayList<>();
    for (int i = 0; i < count; i++) {
      messages.add(
          producer
              .messageBuilder()
              .properties()
              .messageId(prefix + "-" + i)
              .messageBuilder()
              .addData(Harness.body(prefix, i))
              .build());
    }
    return messages;
  }

  /** partition stream -> the message ids read from it (``total`` in all partitions). */
  private static Map<String, List<String>> readPartitions(
      Environment env, String superStream, List<String> suffixes, int total) {
    Map<String, List<String>> ids = new TreeMap<>();
    List<Consumer> consumers = new ArrayList<>();
    for (String suffix : suffixes) {
      String partition = superStream + "-" + suffix;
      List<String> got = new ArrayList<>();
      ids.put(partition, got);
      consumers.add(
          env.consumerBuilder()
              .stream(partition)
              .offset(OffsetSpecification.first())
              .messageHandler(
                  (context, message) -> {
                    synchronized (ids) {
                      got.add(message.getProperties().getMessageIdAsString());
                    }
                  })
              .build());
    }
    Harness.until(
        () -> {
          synchronized (ids) {
            return ids.values().stream().mapToInt(List::size).sum() >= total;
          }
        },
        30,
        total + " messages in the partitions of " + superStream);
    Harness.sleep(300);
    consumers.forEach(Consumer::close);
    synchronized (ids) {
      return new TreeMap<>(ids);
    }
  }

  private static int count(Flow.Received received, String prefix) {
    return (int) received.bodies().stream().filter(b -> b.startsWith(prefix)).count();
  }

  /** partition stream -> the bodies starting with ``prefix`` it delivered, in order. */
  private static Map<String, List<String>> byPartition(Flow.Received received, String prefix) {
    Map<String, List<String>> out = new TreeMap<>();
    List<String> streams = received.streams();
    List<String> bodies = received.bodies();
    for (int i = 0; i < bodies.size(); i++) {
      if (bodies.get(i).startsWith(prefix)) {
        out.computeIfAbsent(streams.get(i), k -> new ArrayList<>()).add(bodies.get(i));
      }
    }
    return out;
  }

  private static Consumer sac(Environment env, String superStream, Flow.Received handler) {
    return env.consumerBuilder()
        .superStream(superStream)
        .name("app")
        .singleActiveConsumer()
        .offset(OffsetSpecification.first())
        .messageHandler(handler)
        .build();
  }
}
