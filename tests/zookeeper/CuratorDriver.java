// Apache Curator (Debian's libcurator-recipes-java) driven line by line over
// stdin/stdout, for the interoperability tests in zk_interop_test.cpp. The
// commands and answers are those of the kazoo driver in zk_test_support.hpp:
//
//   lock KIND PATH TIMEOUT     KIND: lock (InterProcessMutex) | read | write
//                              (InterProcessReadWriteLock)
//                              -> "acquired NODE" | "timeout"
//   semaphore PATH MAX TIMEOUT one lease of InterProcessSemaphoreV2
//                              -> "acquired NODE" | "timeout"
//   release                    -> "released"
//   cycles KIND PATH N LEDGER TAG
//                              N rounds of: acquire, append "enter KIND TAG"
//                              to LEDGER, yield, append "exit KIND TAG",
//                              release -> "done ROUNDS" (fewer than N when
//                              an acquire took over a minute)
//   latch PATH ID              starts a LeaderLatch with participant id ID
//                              -> "latched NODE" once its node exists
//   latch-event TIMEOUT        the latch listener's next call, in order:
//                              -> "leader" | "not-leader" | "none"
//   latch-leader PATH          getLeader() of a latch on PATH
//                              -> "leader ID" | "none"
//   latch-close                -> "closed"
//   exit
//
// Arguments: hosts, session timeout in seconds.
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorDriver {
  private static CuratorFramework client;

  private static InterProcessMutex mutexOf(String kind, String path) {
    switch (kind) {
      case "lock": return new InterProcessMutex(client, path);
      case "read": return new InterProcessReadWriteLock(client, path).readLock();
      case "write": return new InterProcessReadWriteLock(client, path).writeLock();
      default: throw new IllegalArgumentException("unknown kind " + kind);
    }
  }

  // The node a held InterProcessMutex owns (Curator keeps it protected).
  private static String nodeOf(InterProcessMutex m) throws Exception {
    Method get = InterProcessMutex.class.getDeclaredMethod("getLockPath");
    get.setAccessible(true);
    return (String) get.invoke(m);
  }

  private static void append(String ledger, String line) throws Exception {
    // One write(2) on an O_APPEND file: lines of concurrent writers never mix.
    Files.write(Paths.get(ledger), (line + "\n").getBytes(StandardCharsets.UTF_8),
                StandardOpenOption.CREATE, StandardOpenOption.APPEND);
  }

  public static void main(String[] args) throws Exception {
    int sessionMs = (int) (Double.parseDouble(args[1]) * 1000);
    client = CuratorFrameworkFactory.builder()
                 .connectString(args[0])
                 .sessionTimeoutMs(sessionMs)
                 .connectionTimeoutMs(30000)
                 .retryPolicy(new RetryNTimes(3, 100))
                 .build();
    client.start();
    if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
      System.out.println("not connected");
      return;
    }
    System.out.println("ready");
    InterProcessMutex held = null;
    InterProcessSemaphoreV2 semaphore = null;
    Lease lease = null;
    LeaderLatch latch = null;
    // The listener's calls, answered one per latch-event: never interleaved
    // with the answers to other commands.
    LinkedBlockingQueue<String> latchEvents = new LinkedBlockingQueue<>();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      String[] w = line.trim().split("\\s+");
      if (w.length == 0 || w[0].isEmpty()) continue;
      switch (w[0]) {
        case "lock": {
          InterProcessMutex m = mutexOf(w[1], w[2]);
          long ms = (long) (Double.parseDouble(w[3]) * 1000);
          if (m.acquire(ms, TimeUnit.MILLISECONDS)) {
            held = m;
            System.out.println("acquired " + nodeOf(m));
          } else {
            System.out.println("timeout");
          }
          break;
        }
        case "semaphore": {
          semaphore = new InterProcessSemaphoreV2(client, w[1], Integer.parseInt(w[2]));
          long ms = (long) (Double.parseDouble(w[3]) * 1000);
          lease = semaphore.acquire(ms, TimeUnit.MILLISECONDS);
          System.out.println(lease != null ? "acquired " + w[1] + "/leases/" + lease.getNodeName() : "timeout");
          break;
        }
        case "release": {
          if (held != null) held.release();
          if (lease != null) lease.close();
          held = null;
          lease = null;
          System.out.println("released");
          break;
        }
        case "cycles": {
          InterProcessMutex m = mutexOf(w[1], w[2]);
          int n = Integer.parseInt(w[3]);
          String ledger = w[4], tag = w[1] + " " + w[5];
          int done = 0;
          for (; done < n; ++done) {
            if (!m.acquire(60, TimeUnit.SECONDS)) break;
            try {
              append(ledger, "enter " + tag);
              Thread.sleep(0, 200000);  // let another contender try to get in
              append(ledger, "exit " + tag);
            } finally {
              m.release();
            }
          }
          System.out.println("done " + done);
          break;
        }
        case "latch": {
          latch = new LeaderLatch(client, w[1], w[2]);
          latch.addListener(new LeaderLatchListener() {
            public void isLeader() { latchEvents.add("leader"); }
            public void notLeader() { latchEvents.add("not-leader"); }
          });
          latch.start();
          for (int i = 0; i < 3000 && latch.getOurPath() == null; ++i) Thread.sleep(10);
          System.out.println(latch.getOurPath() != null ? "latched " + latch.getOurPath() : "timeout");
          break;
        }
        case "latch-event": {
          long ms = (long) (Double.parseDouble(w[1]) * 1000);
          String event = latchEvents.poll(ms, TimeUnit.MILLISECONDS);
          System.out.println(event != null ? event : "none");
          break;
        }
        case "latch-leader": {
          // Needs no start: it reads the participants' nodes.
          Participant leader = new LeaderLatch(client, w[1]).getLeader();
          System.out.println(leader.isLeader() ? "leader " + leader.getId() : "none");
          break;
        }
        case "latch-close": {
          if (latch != null) latch.close();
          latch = null;
          System.out.println("closed");
          break;
        }
        case "exit":
          client.close();
          return;
        default:
          System.out.println("unknown command " + w[0]);
      }
    }
    client.close();
  }
}
