// Entry point of the Java client's compat scenarios: `java -cp ... riverlog.compat.Scenario
// NAME JSON` runs one scenario against the server the JSON names and prints one JSON object,
// the last line on stdout (interactive scenarios print {"event": ...} lines before it and
// read the test's commands on stdin). Rules: a scenario that throws exits 1 with the stack
// trace on stderr; the pytest side (tests/compat/_java.py) fails the test then.
package riverlog.compat;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.util.Map;
import java.util.TreeMap;

public final class Scenario {

  interface Run {
    JsonObject run(Harness harness) throws Exception;
  }

  private static final Map<String, Run> SCENARIOS = new TreeMap<>();

  static {
    ProducerScenarios.register(SCENARIOS);
    ConsumerScenarios.register(SCENARIOS);
    SuperStreamScenarios.register(SCENARIOS);
    StreamScenarios.register(SCENARIOS);
    RecoveryScenarios.register(SCENARIOS);
    ErrorScenarios.register(SCENARIOS);
  }

  public static void main(String[] argv) {
    if (argv.length != 2 || !SCENARIOS.containsKey(argv[0])) {
      System.err.println("usage: Scenario NAME JSON; NAME one of " + SCENARIOS.keySet());
      System.exit(2);
    }
    int status = 0;
    try {
      JsonObject args = JsonParser.parseString(argv[1]).getAsJsonObject();
      JsonObject result = SCENARIOS.get(argv[0]).run(new Harness(args));
      synchronized (System.out) {
        System.out.println(Harness.GSON.toJson(result));
        System.out.flush();
      }
    } catch (Throwable e) {
      e.printStackTrace();
      status = 1;
    }
    // the client's Netty and scheduler threads are not daemons: end the JVM here
    System.exit(status);
  }
}
