// Go's own etcd lock, go.etcd.io/etcd/clientv3/concurrency.Mutex (Debian's
// golang-etcd-server-dev, built offline by tests/etcd/CMakeLists.txt),
// driven line by line over stdin/stdout for etcd_interop_test.cpp. One
// driver is one client with one session (lease); the commands are those of
// the ZooKeeper drivers (tests/zookeeper):
//
//	lock NAME TIMEOUT_S        -> "acquired KEY TOKEN" | "timeout" | "error ..."
//	release                    -> "released" | "error ..."
//	cycles NAME N LEDGER TAG   N rounds of: lock, append "enter lock TAG TOKEN"
//	                           to LEDGER, yield, append "exit lock TAG",
//	                           unlock -> "done ROUNDS" (fewer than N when a
//	                           lock took over a minute or failed)
//	exit
//
// TOKEN is the create revision of the Mutex's key, what the Mutex's IsOwner
// compares. Arguments: endpoints (host:port,...), session TTL in seconds.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

type driver struct {
	client  *clientv3.Client
	session *concurrency.Session
	held    *concurrency.Mutex
}

// lock takes NAME within `timeout` and returns its key's create revision.
func (d *driver) lock(name string, timeout time.Duration) (*concurrency.Mutex, int64, error) {
	m := concurrency.NewMutex(d.session, name)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := m.Lock(ctx); err != nil {
		return nil, 0, err
	}
	resp, err := d.client.Get(ctx, m.Key())
	if err != nil || len(resp.Kvs) != 1 {
		m.Unlock(context.Background())
		return nil, 0, fmt.Errorf("reading my key %q: %v", m.Key(), err)
	}
	return m, resp.Kvs[0].CreateRevision, nil
}

func unlock(m *concurrency.Mutex) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return m.Unlock(ctx)
}

// appendLine writes one line in one write(2) on an O_APPEND file.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write([]byte(line + "\n"))
	return err
}

func (d *driver) cycles(name string, rounds int, ledger, tag string) int {
	for i := 0; i < rounds; i++ {
		m, token, err := d.lock(name, time.Minute)
		if err != nil {
			fmt.Fprintln(os.Stderr, "go driver: lock:", err)
			return i
		}
		appendLine(ledger, fmt.Sprintf("enter lock %s %d", tag, token))
		time.Sleep(200 * time.Microsecond) // let another contender try to get in
		appendLine(ledger, "exit lock "+tag)
		if err := unlock(m); err != nil {
			fmt.Fprintln(os.Stderr, "go driver: unlock:", err)
			return i
		}
	}
	return rounds
}

func (d *driver) handle(words []string) string {
	switch {
	case words[0] == "lock" && len(words) == 3:
		seconds, _ := strconv.ParseFloat(words[2], 64)
		m, token, err := d.lock(words[1], time.Duration(seconds*float64(time.Second)))
		if errors.Is(err, context.DeadlineExceeded) {
			return "timeout"
		} else if err != nil {
			return "error " + err.Error()
		}
		d.held = m
		return fmt.Sprintf("acquired %s %d", m.Key(), token)
	case words[0] == "release" && d.held != nil:
		err := unlock(d.held)
		d.held = nil
		if err != nil {
			return "error " + err.Error()
		}
		return "released"
	case words[0] == "cycles" && len(words) == 5:
		n, _ := strconv.Atoi(words[2])
		return fmt.Sprintf("done %d", d.cycles(words[1], n, words[3], words[4]))
	}
	return "error unknown command " + strings.Join(words, " ")
}

// connect makes the client and its session, each attempt bounded: a Go
// client whose first connection hangs on a loaded machine waits forever
// for its lease otherwise (seen once in CI). A new client per attempt.
func connect(endpoints []string, ttl int) (*clientv3.Client, *concurrency.Session) {
	for attempt := 1; ; attempt++ {
		client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 20 * time.Second})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			lease, gerr := client.Grant(ctx, int64(ttl))
			cancel()
			if gerr == nil {
				session, serr := concurrency.NewSession(client, concurrency.WithLease(lease.ID))
				if serr == nil {
					return client, session
				}
				err = serr
			} else {
				err = gerr
			}
			client.Close()
		}
		fmt.Fprintf(os.Stderr, "go driver: connecting, attempt %d: %v\n", attempt, err)
		if attempt == 4 {
			os.Exit(1)
		}
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go_mutex_driver host:port[,host:port...] session-ttl-seconds")
		os.Exit(2)
	}
	ttl, _ := strconv.Atoi(os.Args[2])
	// However the connection goes, "ready" or an exit within 60 s, with
	// the goroutines' stacks to say where it hung.
	connected := make(chan struct{})
	go func() {
		select {
		case <-connected:
		case <-time.After(60 * time.Second):
			fmt.Fprintln(os.Stderr, "go driver: not connected after 60 s; goroutines:")
			pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			os.Exit(1)
		}
	}()
	client, session := connect(strings.Split(os.Args[1], ","), ttl)
	close(connected)
	defer client.Close()
	defer session.Close() // revokes the lease: its keys go with it
	d := &driver{client: client, session: session}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		words := strings.Fields(in.Text())
		if len(words) == 0 {
			continue
		}
		if words[0] == "exit" {
			return
		}
		fmt.Println(d.handle(words))
	}
}
