// Burns os.Args[1] seconds of its own CPU time: 70% in kilnHotA, 30% in kilnHotB. Go keeps
// frame pointers on amd64 and arm64, so the agent walks its stacks without DWARF. A leaf
// with no stack frame has no frame pointer of its own, and a frame-pointer walk from it
// skips its caller; spin's array, indexed at run time, gives it a frame.
package main

import (
	"os"
	"strconv"
	"syscall"
	"time"
)

var sink uint64

//go:noinline
func spin(iterations int) {
	var state [4]uint64
	state[0] = sink
	for i := 1; i <= iterations; i++ {
		state[i&3] = state[(i-1)&3]*6364136223846793005 + 1442695040888963407
	}
	sink = state[iterations&3]
}

//go:noinline
func kilnHotA() { spin(7000000) }

//go:noinline
func kilnHotB() { spin(3000000) }

func cpuTime() time.Duration {
	var usage syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &usage)
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

func main() {
	seconds := 10.0
	if len(os.Args) > 1 {
		if parsed, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = parsed
		}
	}
	limit := time.Duration(seconds * float64(time.Second))
	for cpuTime() < limit {
		kilnHotA()
		kilnHotB()
	}
}
