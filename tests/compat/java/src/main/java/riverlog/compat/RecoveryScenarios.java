// Scenarios of the client's topology and automatic recovery: where it connects in a cluster
// (locator, producer on the leader, consumer on a replica), and publishing plus consuming
// through a fault the pytest side makes (a server restart, a SIGKILL of the leader): it
// prints {"event": "publishing"} once messages flow, waits for the test's line on stdin
// ("done" once the fault is made), then checks that the producer and consumer recovered.
package riverlog.compat;

import com.google.gson.JsonObject;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

final class RecoveryScenarios {

  private RecoveryScenarios() {}

  static void register(Map<String, Scenario.Run> scenarios) {
    scenarios.put("placement", RecoveryScenarios::placement);
    scenarios.put("through_fault", RecoveryScenarios::throughFault);
  }

  /**
   * Creates "stream" with ``replicas`` members (initial-cluster-size), then a producer (100
   * messages) and a consumer from first. Result: {"locator": [addresses], "producer": [...],
   * "consumer": [...], "confirmed", "bodies"}: the addresses each step connected to.
   */
  static JsonObject placement(Harness h) {
    String stream = h.str("stream");
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator().stream(stream).initialMemberCount(h.integer("replicas", 3)).create();
      out.add("locator", Harness.json(h.resolvedSince(0)));
      int mark = h.resolved.size();
      Producer producer = env.producerBuilder().stream(stream).build();
      out.add("producer", Harness.json(h.resolvedSince(mark)));
      out.addProperty(
          "confirmed", Flow.sendAll(producer, Flow.plain(producer, "m", 0, 100), 60).confirmed.size());
      mark = h.resolved.size();
      Flow.Received got = Flow.read(env, stream, OffsetSpecification.first(), 100);
      out.add("consumer", Harness.json(h.resolvedSince(mark)));
      out.add("bodies", Harness.json(got.bodies()));
      producer.close();
    }
    return out;
  }

  /**
   * Creates "stream" (``replicas`` members when given), consumes it from first and publishes
   * m-0, m-1, ... (at most ~2,000 a second) until 300 are confirmed; prints the event
   * "publishing"; waits for the test's line; then publishes until 300 more are confirmed,
   * stops, waits for the outstanding confirmations and for the consumer to hold every
   * confirmed message. Result: {"sent", "confirmed", "confirmed_after_fault", "failed": {code:
   * n}, "missing": [first 20], "missing_count", "duplicate_offsets", "out_of_order",
   * "duplicate_bodies", "producer_states", "consumer_states", "addresses_before",
   * "addresses_after"}.
   */
  static JsonObject throughFault(Harness h) throws InterruptedException {
    String stream = h.str("stream");
    Set<Long> confirmed = ConcurrentHashMap.newKeySet();
    Map<Integer, Integer> failed = Collections.synchronizedMap(new TreeMap<>());
    Set<Long> consumedBodies = ConcurrentHashMap.newKeySet();
    Set<Long> consumedOffsets = ConcurrentHashMap.newKeySet();
    AtomicLong duplicateOffsets = new AtomicLong();
    AtomicLong duplicateBodies = new AtomicLong();
    AtomicLong outOfOrder = new AtomicLong();
    AtomicLong lastOffset = new AtomicLong(-1);
    AtomicLong answered = new AtomicLong();
    List<String> producerStates = Collections.synchronizedList(new ArrayList<>());
    List<String> consumerStates = Collections.synchronizedList(new ArrayList<>());
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      var creator = env.streamCreator().stream(stream);
      if (h.args.has("replicas")) {
        creator.initialMemberCount(h.integer("replicas", 3));
      }
      creator.create();
      Consumer consumer =
          env.consumerBuilder()
              .stream(stream)
              .offset(OffsetSpecification.first())
              .listeners(Harness.stateRecorder(consumerStates))
              .messageHandler(
                  (context, message) -> {
                    long offset = context.offset();
                    if (!consumedOffsets.add(offset)) {
                      duplicateOffsets.incrementAndGet();
                    }
                    if (offset <= lastOffset.getAndSet(offset)) {
                      outOfOrder.incrementAndGet();
                    }
                    String body = Harness.text(message.getBodyAsBinary());
                    if (!consumedBodies.add(Long.parseLong(body.substring(2)))) {
                      duplicateBodies.incrementAndGet();
                    }
                  })
              .build();
      Producer producer =
          env.producerBuilder()
              .stream(stream)
              .confirmTimeout(Duration.ofSeconds(10))
              .listeners(Harness.stateRecorder(producerStates))
              .build();
      AtomicBoolean stop = new AtomicBoolean();
      AtomicLong sent = new AtomicLong();
      Thread publisher =
          new Thread(
              () -> {
                for (long i = 0; !stop.get(); i++) {
                  long id = i;
                  producer.send(
                      producer.messageBuilder().addData(Harness.body("m", id)).build(),
                      status -> {
                        if (status.isConfirmed()) {
                          confirmed.add(id);
                        } else {
                          failed.merge((int) status.getCode(), 1, Integer::sum);
                        }
                        answered.incrementAndGet();
                      });
                  sent.incrementAndGet();
                  if (i % 10 == 9) {
                    Harness.sleep(5);
                  }
                }
              },
              "publisher");
      publisher.start();
      Harness.until(() -> confirmed.size() >= 300, 60, "300 confirmed before the fault");
      int mark = h.resolved.size(); // the fault comes after the event
      out.add("addresses_before", Harness.json(h.resolvedSince(0).subList(0, mark)));
      JsonObject ready = new JsonObject();
      ready.addProperty("confirmed", confirmed.size());
      Harness.event("publishing", ready);
      out.addProperty("command", Harness.command());
      int atFault = confirmed.size();
      Harness.until(
          () -> confirmed.size() >= atFault + 300, 120, "300 more confirmed after the fault");
      stop.set(true);
      publisher.join();
      Harness.until(() -> answered.get() >= sent.get(), 60, "every outstanding confirmation");
      // not "until": what is missing then is the result
      Harness.within(() -> consumedBodies.containsAll(confirmed), 60);
      Harness.sleep(300);
      consumer.close();
      producer.close();
      List<Long> missing = new ArrayList<>();
      for (Long id : new java.util.TreeSet<>(confirmed)) {
        if (!consumedBodies.contains(id) && missing.size() < 20) {
          missing.add(id);
        }
      }
      out.addProperty("sent", sent.get());
      out.addProperty("confirmed", confirmed.size());
      out.addProperty("confirmed_after_fault", confirmed.size() - atFault);
      out.add("failed", Harness.json(new TreeMap<>(failed)));
      out.add("missing", Harness.json(missing));
      out.addProperty("consumed", consumedBodies.size());
      out.addProperty("duplicate_offsets", duplicateOffsets.get());
      out.addProperty("out_of_order", outOfOrder.get());
      out.addProperty("duplicate_bodies", duplicateBodies.get());
      out.add("producer_states", Harness.json(new ArrayList<>(producerStates)));
      out.add("consumer_states", Harness.json(new ArrayList<>(consumerStates)));
      out.add("addresses_after", Harness.json(h.resolvedSince(mark)));
    }
    return out;
  }
}
