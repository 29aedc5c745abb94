// A Go program for Kiln's scrape tests: it exposes net/http/pprof on a loopback port
// (printed on the first line of its output) and spends its CPU in one known function.
package main

import (
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"time"
)

var sink []byte

//go:noinline
func kilnBurnCPU(n int) int {
	x := 0
	for i := 0; i < n; i++ {
		x += i * i % 7
	}
	return x
}

//go:noinline
func kilnAllocate() {
	sink = make([]byte, 64<<10)
}

func main() {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(listener.Addr().String())
	go func() {
		for {
			kilnBurnCPU(10_000_000)
		}
	}()
	go func() {
		for {
			kilnAllocate()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	if err := http.Serve(listener, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
