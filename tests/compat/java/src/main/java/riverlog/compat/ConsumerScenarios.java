// Consumer scenarios: every offset specification, manual and automatic offset tracking
// across a consumer restart, single active consumer failover on a stream, and filtering
// (filter values on publish, filter values and match-unfiltered on consume). Each creates its
// stream (the argument's "stream") and deletes it at the end.
package riverlog.compat;

import com.google.gson.JsonObject;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Message;
import com.rabbitmq.stream.NoOffsetException;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

final class ConsumerScenarios {

  private ConsumerScenarios() {}

  static void register(Map<String, Scenario.Run> scenarios) {
    scenarios.put("offset_specs", ConsumerScenarios::offsetSpecs);
    scenarios.put("tracking", ConsumerScenarios::tracking);
    scenarios.put("sac", ConsumerScenarios::singleActiveConsumer);
    scenarios.put("filtering", ConsumerScenarios::filtering);
  }

  /**
   * Three batches of 10 (m-0..m-29), each confirmed before the next, with a pause before the
   * second (``timestamp`` is taken in it); then a consumer per offset specification (first,
   * last, next, offset 15, timestamp), then m-30..m-39. Result: {"committed_chunk_id" (before
   * subscribing), "timestamp", SPEC: {"offsets", "bodies"}}.
   */
  static JsonObject offsetSpecs(Harness h) {
    String stream = h.str("stream");
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator().stream(stream).create();
      Producer producer = env.producerBuilder().stream(stream).build();
      Flow.sendAll(producer, Flow.plain(producer, "m", 0, 10), 30);
      Harness.sleep(300);
      long timestamp = System.currentTimeMillis();
      Harness.sleep(300);
      Flow.sendAll(producer, Flow.plain(producer, "m", 10, 20), 30);
      Flow.sendAll(producer, Flow.plain(producer, "m", 20, 30), 30);
      out.addProperty("committed_chunk_id", env.queryStreamStats(stream).committedChunkId());
      out.addProperty("timestamp", timestamp);
      Map<String, OffsetSpecification> specs = new LinkedHashMap<>();
      specs.put("first", OffsetSpecification.first());
      specs.put("last", OffsetSpecification.last());
      specs.put("next", OffsetSpecification.next());
      specs.put("offset", OffsetSpecification.offset(15));
      specs.put("timestamp", OffsetSpecification.timestamp(timestamp));
      Map<String, Flow.Received> received = new LinkedHashMap<>();
      List<Consumer> consumers = new ArrayList<>();
      for (Map.Entry<String, OffsetSpecification> spec : specs.entrySet()) {
        Flow.Received got = new Flow.Received();
        received.put(spec.getKey(), got);
        consumers.add(
            env.consumerBuilder()
                .stream(stream)
                .offset(spec.getValue())
                .messageHandler(got)
                .build());
      }
      // let every subscription reach the end of the log before the last batch
      received.get("first").waitFor(30, 30, 500);
      Flow.sendAll(producer, Flow.plain(producer, "m", 30, 40), 30);
      for (Flow.Received got : received.values()) {
        Harness.until(
            () -> got.bodies().contains("m-39"), 30, "m-39 at every consumer");
      }
      Harness.sleep(300);
      consumers.forEach(Consumer::close);
      producer.close();
      env.deleteStream(stream);
      received.forEach((spec, got) -> out.add(spec, got.json()));
    }
    return out;
  }

  /**
   * Manual tracking: consumer "manual" reads m-0..m-99 and stores the offset of m-49 with
   * context.storeOffset(); a new "manual" consumer (offset spec first) must resume after it.
   * Automatic tracking: consumer "auto" (every 10 messages, flush 2 s) reads all, is closed
   * (it stores on close); m-100..m-119 are sent; a new "auto" consumer must get those only.
   * Result: {"manual_stored", "manual_stored_expected", "manual_second": {...},
   * "auto_stored", "auto_second": {...}}.
   */
  static JsonObject tracking(Harness h) {
    String stream = h.str("stream");
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator().stream(stream).create();
      Producer producer = env.producerBuilder().stream(stream).build();
      Flow.sendAll(producer, Flow.plain(producer, "m", 0, 100), 30);
      long[] storedAt = {-1};
      Flow.Received first = new Flow.Received();
      Consumer manual =
          env.consumerBuilder()
              .stream(stream)
              .name("manual")
              .offset(OffsetSpecification.first())
              .manualTrackingStrategy()
              .checkInterval(Duration.ZERO)
              .builder()
              .messageHandler(
                  (context, message) -> {
                    first.handle(context, message);
                    if (Harness.text(message.getBodyAsBinary()).equals("m-49")) {
                      storedAt[0] = context.offset();
                      context.storeOffset();
                    }
                  })
              .build();
      first.waitFor(100, 30, 0);
      Harness.until(() -> storedOffset(manual) == storedAt[0], 30, "the stored offset");
      out.addProperty("manual_stored", storedOffset(manual));
      out.addProperty("manual_stored_expected", storedAt[0]);
      manual.close();
      Flow.Received second = new Flow.Received();
      Consumer manualAgain =
          env.consumerBuilder()
              .stream(stream)
              .name("manual")
              .offset(OffsetSpecification.first())
              .manualTrackingStrategy()
              .builder()
              .messageHandler(second)
              .build();
      second.waitFor(50, 30, 500);
      manualAgain.close();
      out.add("manual_second", second.json());

      Flow.Received autoFirst = new Flow.Received();
      Consumer auto =
          env.consumerBuilder()
              .stream(stream)
              .name("auto")
              .offset(OffsetSpecification.first())
              .autoTrackingStrategy()
              .messageCountBeforeStorage(10)
              .flushInterval(Duration.ofSeconds(2))
              .builder()
              .messageHandler(autoFirst)
              .build();
      autoFirst.waitFor(100, 30, 0);
      auto.close();
      Flow.sendAll(producer, Flow.plain(producer, "m", 100, 120), 30);
      Flow.Received autoSecond = new Flow.Received();
      Consumer autoAgain =
          env.consumerBuilder()
              .stream(stream)
              .name("auto")
              .offset(OffsetSpecification.first())
              .autoTrackingStrategy()
              .builder()
              .messageHandler(autoSecond)
              .build();
      autoSecond.waitFor(20, 30, 500);
      out.addProperty("auto_stored", storedOffset(autoAgain));
      out.add("auto_first_offsets", Harness.json(autoFirst.offsets()));
      autoAgain.close();
      out.add("auto_second", autoSecond.json());
      producer.close();
      env.deleteStream(stream);
    }
    return out;
  }

  private static long storedOffset(Consumer consumer) {
    try {
      return consumer.storedOffset();
    } catch (NoOffsetException e) {
      return -1;
    }
  }

  /**
   * Two single active consumers of the group "app" (automatic tracking); m-0..m-49 are sent,
   * the active one is closed, m-50..m-99 are sent. Result: {"one": {...}, "two_before": n,
   * "two": {...}}.
   */
  static JsonObject singleActiveConsumer(Harness h) {
    String stream = h.str("stream");
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator().stream(stream).create();
      Producer producer = env.producerBuilder().stream(stream).build();
      Flow.Received one = new Flow.Received();
      Flow.Received two = new Flow.Received();
      Consumer first = sac(env, stream, one);
      Consumer second = sac(env, stream, two);
      Flow.sendAll(producer, Flow.plain(producer, "m", 0, 50), 30);
      one.waitFor(50, 30, 500);
      out.addProperty("two_before", two.size());
      first.close();
      Flow.sendAll(producer, Flow.plain(producer, "m", 50, 100), 30);
      Harness.until(() -> two.bodies().contains("m-99"), 30, "m-99 at the second consumer");
      Harness.sleep(300);
      second.close();
      producer.close();
      env.deleteStream(stream);
      out.add("one", one.json());
      out.add("two", two.json());
    }
    return out;
  }

  private static Consumer sac(Environment env, String stream, Flow.Received handler) {
    return env.consumerBuilder()
        .stream(stream)
        .name("app")
        .singleActiveConsumer()
        .offset(OffsetSpecification.first())
        .messageHandler(handler)
        .build();
  }

  /**
   * Four batches of 50, each confirmed before the next: state "california", "texas", none,
   * "california" (the producer's filterValue reads the application property "state"). Then
   * a consumer filtering "california" and one filtering "california" with match-unfiltered;
   * each post-filter records every message the server sent it. Result: {"only": {"sent":
   * {state: n}, "bodies"}, "unfiltered": {...}}.
   */
  static JsonObject filtering(Harness h) {
    String stream = h.str("stream");
    JsonObject out = new JsonObject();
    try (Environment env = h.environment()) {
      env.streamCreator().stream(stream).create();
      Producer producer =
          env.producerBuilder()
              .stream(stream)
              .filterValue(ConsumerScenarios::state)
              .build();
      String[] states = {"california", "texas", null, "california"};
      for (int batch = 0; batch < states.length; batch++) {
        List<Message> messages = new ArrayList<>();
        for (int i = batch * 50; i < batch * 50 + 50; i++) {
          var builder = producer.messageBuilder().addData(Harness.body("m", i));
          if (states[batch] != null) {
            builder = builder.applicationProperties().entry("state", states[batch]).messageBuilder();
          }
          messages.add(builder.build());
        }
        Flow.sendAll(producer, messages, 30);
      }
      producer.close();
      out.add("only", filtered(env, stream, false, 100));
      out.add("unfiltered", filtered(env, stream, true, 150));
      env.deleteStream(stream);
    }
    return out;
  }

  private static String state(Message message) {
    Object state =
        message.getApplicationProperties() == null
            ? null
            : message.getApplicationProperties().get("state");
    return state == null ? null : state.toString();
  }

  private static JsonObject filtered(
      Environment env, String stream, boolean matchUnfiltered, int expected) {
    Map<String, Integer> sent = new LinkedHashMap<>();
    Flow.Received got = new Flow.Received();
    Consumer consumer =
        env.consumerBuilder()
            .stream(stream)
            .offset(OffsetSpecification.first())
            .filter()
            .values("california")
            .matchUnfiltered(matchUnfiltered)
            .postFilter(
                message -> {
                  String state = state(message);
                  synchronized (sent) {
                    sent.merge(String.valueOf(state), 1, Integer::sum);
                  }
                  return "california".equals(state) || (matchUnfiltered && state == null);
                })
            .builder()
            .messageHandler(got)
            .build();
    got.waitFor(expected, 30, 500);
    consumer.close();
    JsonObject out = got.json();
    synchronized (sent) {
      out.add("sent", Harness.json(sent));
    }
    return out;
  }
}
