# Kiln's Ruby burner (crates/kiln/tests/integration/interpreters.rs): 7:3 of its time
# in two named methods, each running a block under Integer#times (a method written in
# C), called from a named main, for ARGV[0] seconds. With "compress", a method spends
# its time in a C extension (zlib) instead; with "long", in a loop at line 402 of a
# method defined in "kiln_long.rb", past 1,000 instruction positions (so its line is
# found through every part of CRuby's line index); with "threads", two threads take
# turns at kiln_hot_a and kiln_hot_b.
require "zlib"

def kiln_hot_a(n)
  x = 0
  n.times { |i| x = (x * 31 + i) % 1000003 }
  x
end

def kiln_hot_b(n)
  x = 0
  n.times { |i| x = (x * 31 + i) % 1000003 }
  x
end

def kiln_compress(data)
  Zlib::Deflate.deflate(data, 9)
end

KILN_LONG = (["def kiln_long(n)", "  a = 0"] +
             (3..401).map { |line| "  a = a + #{line}" } +
             ["  i = 0; while i < n; a = (a * 31 + i) % 1000003; i += 1; end",
              "  a", "end"]).join("\n")
Object.class_eval(KILN_LONG, "kiln_long.rb", 1)

def kiln_main(seconds, mode)
  finish = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  data = (0..255).map(&:chr).join * 4096
  now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  case mode
  when "threads"
    threads = [[:kiln_hot_a, 1000], [:kiln_hot_b, 1000]].map do |name, n|
      Thread.new { send(name, n) while now.call < finish }
    end
    threads.each(&:join)
  else
    while now.call < finish
      case mode
      when "compress" then kiln_compress(data)
      when "long" then kiln_long(10_000)
      else # the same work, 70/30 at random: no period for the sampling to fall in step with
        if rand < 0.7 then kiln_hot_a(1000)
        else kiln_hot_b(1000) end
      end
    end
  end
end

sleep 1 # the agent finds the VM at the first samples; the work then has its frames
kiln_main(Float(ARGV[0]), ARGV[1] || "plain")
