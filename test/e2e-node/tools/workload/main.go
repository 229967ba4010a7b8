// Command workload is the only program of the end-to-end test's image: it
// serves as the pod sandbox's pause process and as every test container,
// and just waits for SIGTERM, so the test can read what the runtime gave it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
