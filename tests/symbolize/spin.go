// Kiln's symbolization test program in Go: two hot functions, each spending its time in
// a small function the compiler inlines into it, called 7:3 from main for os.Args[1]
// seconds of CPU. Built as is and stripped with -ldflags="-s -w", as Go release builds
// ship (crates/kiln-symbolize/tests/go_binaries.rs,
// crates/kiln/tests/integration/symbolization.rs).
package main

import (
	"os"
	"strconv"
	"syscall"
)

var sink uint64

func mixA(x uint64) uint64 {
	return x*6364136223846793005 + 1442695040888963407
}

func mixB(x uint64) uint64 {
	return (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9
}

//go:noinline
func hotA(n uint64) {
	x := n
	for i := uint64(0); i < n; i++ {
		x = mixA(x ^ i)
	}
	sink = x
}

//go:noinline
func hotB(n uint64) {
	x := n
	for i := uint64(0); i < n; i++ {
		x = mixB(x + i)
	}
	sink = x
}

// The process's own CPU time: two builds run side by side on a busy machine then make
// the same calls, whatever share of the CPU each got.
func cpuSeconds() float64 {
	var usage syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &usage) != nil {
		return 0
	}
	return float64(usage.Utime.Sec+usage.Stime.Sec) + float64(usage.Utime.Usec+usage.Stime.Usec)/1e6
}

//go:noinline
func mainLoop(seconds float64) {
	for cpuSeconds() < seconds {
		for i := 0; i < 10; i++ {
			if i < 7 {
				hotA(200000)
			} else {
				hotB(200000)
			}
		}
	}
}

func main() {
	seconds := 1.0
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = s
		}
	}
	mainLoop(seconds)
}
