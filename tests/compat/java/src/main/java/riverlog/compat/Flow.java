// Publishing and receiving helpers of the scenarios: send messages and wait for every
// confirmation (Sent), and a MessageHandler that keeps what it was given (Received).
// Rules: nothing here asserts beyond "the wait ended in time"; outcomes are returned.
package riverlog.compat;

import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import com.rabbitmq.stream.ConfirmationStatus;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Message;
import com.rabbitmq.stream.MessageHandler;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;

final class Flow {

  private Flow() {}

  /** The confirmations of one sendAll: publishing ids confirmed, codes of the others. */
  static final class Sent {
    final List<Long> confirmed = new ArrayList<>();
    final List<Integer> failedCodes = new ArrayList<>();

    JsonObject json() {
      JsonObject out = new JsonObject();
      out.addProperty("confirmed", confirmed.size());
      out.add("failed_codes", Harness.json(failedCodes));
      return out;
    }
  }

  /** Send every message and wait (``seconds`` at most) until each is confirmed or failed. */
  static Sent sendAll(Producer producer, List<Message> messages, int seconds) {
    Sent sent = new Sent();
    CountDownLatch done = new CountDownLatch(messages.size());
    for (Message message : messages) {
      producer.send(
          message,
          status -> {
            record(sent, status);
            done.countDown();
          });
    }
    Harness.await(done, seconds, messages.size() + " confirmations");
    return sent;
  }

  private static synchronized void record(Sent sent, ConfirmationStatus status) {
    if (status.isConfirmed()) {
      sent.confirmed.add(status.getMessage().getPublishingId());
    } else {
      sent.failedCodes.add((int) status.getCode());
    }
  }

  /** Plain messages with the bodies prefix-from .. prefix-(to - 1). */
  static List<Message> plain(Producer producer, String prefix, int from, int to) {
    List<Message> messages = new ArrayList<>();
    for (int i = from; i < to; i++) {
      messages.add(producer.messageBuilder().addData(Harness.body(prefix, i)).build());
    }
    return messages;
  }

  /** A MessageHandler keeping (offset, body, stream, chunk timestamp) of every message. */
  static final class Received implements MessageHandler {
    private final List<Long> offsets = new ArrayList<>();
    private final List<String> bodies = new ArrayList<>();
    private final List<String> streams = new ArrayList<>();
    private final List<Long> timestamps = new ArrayList<>();

    @Override
    public synchronized void handle(Context context, Message message) {
      offsets.add(context.offset());
      bodies.add(Harness.text(message.getBodyAsBinary()));
      streams.add(context.stream());
      timestamps.add(context.timestamp());
    }

    synchronized int size() {
      return offsets.size();
    }

    synchronized List<Long> offsets() {
      return new ArrayList<>(offsets);
    }

    synchronized List<String> bodies() {
      return new ArrayList<>(bodies);
    }

    synchronized List<String> streams() {
      return new ArrayList<>(streams);
    }

    synchronized List<Long> timestamps() {
      return new ArrayList<>(timestamps);
    }

    /** Wait until ``n`` messages arrived, then ``settleMs`` more for any extra ones. */
    Received waitFor(int n, int seconds, long settleMs) {
      Harness.until(() -> size() >= n, seconds, n + " messages (got " + size() + ")");
      Harness.sleep(settleMs);
      return this;
    }

    /** {"offsets": [...], "bodies": [...]} */
    synchronized JsonObject json() {
      JsonObject out = new JsonObject();
      out.add("offsets", Harness.json(offsets));
      out.add("bodies", Harness.json(bodies));
      return out;
    }
  }

  /**
   * What a consumer of ``stream`` from ``spec`` gets: it runs until ``count`` messages came
   * (60 s at most) and 300 ms more, then it is closed.
   */
  static Received read(Environment env, String stream, OffsetSpecification spec, int count) {
    Received got = new Received();
    Consumer consumer =
        env.consumerBuilder().stream(stream).offset(spec).messageHandler(got).build();
    try {
      got.waitFor(count, 60, 300);
    } finally {
      consumer.close();
    }
    return got;
  }

  static JsonArray strings(List<String> values) {
    JsonArray out = new JsonArray();
    values.forEach(out::add);
    return out;
  }
}
