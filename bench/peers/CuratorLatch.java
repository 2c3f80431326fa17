// Peer: Curator's LeaderLatch, one participant of the election benchmark
// (bench/election.py). The same lines as bench/election_participant.cpp,
// stamped with System.nanoTime (CLOCK_MONOTONIC on Linux):
//   STARTED <ns> / LEADER <ns> / RESIGN <ns>
// Usage: java -cp ... CuratorLatch HOST:PORT PATH ID ROUNDS HOLD_MS SESSION_MS
// HOLD_MS -1 holds the first term until the process is killed.
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorLatch {
  static void say(String line) {
    System.out.println(line);
    System.out.flush();
  }

  public static void main(String[] a) throws Exception {
    String connect = a[0], path = a[1], id = a[2];
    int rounds = Integer.parseInt(a[3]), holdMs = Integer.parseInt(a[4]), sessionMs = Integer.parseInt(a[5]);
    CuratorFramework client = CuratorFrameworkFactory.newClient(
        connect, sessionMs, 10000, new ExponentialBackoffRetry(100, 10));
    client.start();
    if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) System.exit(5);
    say("STARTED " + System.nanoTime());
    for (int round = 0; round < rounds; ++round) {
      LeaderLatch latch = new LeaderLatch(client, path, id);
      latch.start();
      if (!latch.await(5, TimeUnit.MINUTES)) System.exit(3);
      say("LEADER " + System.nanoTime());
      if (holdMs < 0) {
        Thread.sleep(3600_000L);
        System.exit(0);
      }
      Thread.sleep(holdMs);
      say("RESIGN " + System.nanoTime());
      latch.close();  // deletes its node: the next in line is told
    }
    client.close();
    System.exit(0);
  }
}
