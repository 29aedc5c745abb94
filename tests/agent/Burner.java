// Kiln's Java burner (crates/kiln/tests/integration/interpreters.rs): 7:3 of its time in
// two named methods, called from a named main, for args[0] seconds, run with no flag. The
// JIT compiles all three. With "inline", each call is short, so that kiln_main loops
// often enough for C2 to compile it with the hot two inlined into it: their time must
// stay theirs. With "threads", a service of 100 threads: 99 wake every few milliseconds
// for a little work, beside the main one.
import java.util.SplittableRandom;

public class Burner {
    static volatile long sink;

    static long kiln_hot_a(long n) {
        long x = 0;
        for (long i = 0; i < n; i++) x = (x * 31 + i) % 1000003;
        return x;
    }

    static long kiln_hot_b(long n) {
        long x = 0;
        for (long i = 0; i < n; i++) x = (x * 31 + i) % 1000003;
        return x;
    }

    static long kiln_main(double seconds, long n) {
        long finish = System.nanoTime() + (long) (seconds * 1e9);
        SplittableRandom random = new SplittableRandom();
        long total = 0;
        while (System.nanoTime() < finish) {
            // The same work, 70/30 at random: no period for the sampling to fall in step with.
            if (random.nextDouble() < 0.7) {
                total += kiln_hot_a(n);
            } else {
                total += kiln_hot_b(n);
            }
        }
        return total;
    }

    static void kiln_idle_worker(double seconds) {
        long finish = System.nanoTime() + (long) (seconds * 1e9);
        while (System.nanoTime() < finish) {
            try {
                Thread.sleep(5);
            } catch (InterruptedException e) {
                return;
            }
            sink += kiln_hot_b(2000);
        }
    }

    public static void main(String[] args) throws Exception {
        double seconds = Double.parseDouble(args[0]);
        String mode = args.length > 1 ? args[1] : "plain";
        // The agent finds the JVM at its first samples; the work then has its frames.
        Thread.sleep(1000);
        Thread[] workers = new Thread[mode.equals("threads") ? 99 : 0];
        for (int i = 0; i < workers.length; i++) {
            workers[i] = new Thread(() -> kiln_idle_worker(seconds), "kiln-worker-" + i);
            workers[i].start();
        }
        sink += kiln_main(seconds, mode.equals("inline") ? 200 : 100000);
        for (Thread worker : workers) worker.join();
    }
}
