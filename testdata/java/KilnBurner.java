import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.locks.LockSupport;

/**
 * A program with known hot spots for Kiln's JFR test: CPU in kilnHotMethod, allocations
 * in kilnAllocate, monitor contention in kilnContend and parking in kilnPark.
 */
public class KilnBurner {
    static volatile long sink;
    static final Object LOCK = new Object();

    static long kilnHotMethod(long n) {
        long acc = 0;
        for (long i = 0; i < n; i++) {
            acc += (i * 31) ^ (acc >>> 3);
        }
        return acc;
    }

    static List<byte[]> kilnAllocate(int count) {
        List<byte[]> list = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            list.add(new byte[1024 + (i % 64) * 1024]);
        }
        return list;
    }

    static void kilnHoldLock() throws InterruptedException {
        synchronized (LOCK) {
            Thread.sleep(40);
        }
    }

    static void kilnContend() {
        synchronized (LOCK) {
            sink++;
        }
    }

    static void kilnPark() {
        LockSupport.parkNanos(30_000_000L);
    }

    public static void main(String[] args) throws Exception {
        long seconds = args.length > 0 ? Long.parseLong(args[0]) : 3;
        long end = System.nanoTime() + seconds * 1_000_000_000L;
        Thread holder = new Thread(() -> {
            try {
                while (System.nanoTime() < end) {
                    kilnHoldLock();
                    Thread.sleep(5);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        Thread contender = new Thread(() -> {
            while (System.nanoTime() < end) {
                kilnContend();
                kilnPark();
            }
        });
        holder.start();
        contender.start();
        while (System.nanoTime() < end) {
            sink += kilnHotMethod(5_000_000);
            sink += kilnAllocate(200).size();
        }
        holder.join();
        contender.join();
    }
}
