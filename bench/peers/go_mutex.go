// Peer: Go's etcd lock, go.etcd.io/etcd/clientv3/concurrency.Mutex (etcd
// 3.4, Debian's golang-etcd-server-dev), as `etcdctl lock` and the server's
// v3lock RPC use it. Driven by bench/peers/go_mutex.py, which speaks
// run_bench.py's peer protocol (bench/peers/common.py computes the
// statistics, as for the Python peers). Built offline by bench/run.sh:
//
//	GO111MODULE=off GOPATH=SCRATCH:/usr/share/gocode GOCACHE=SCRATCH/cache \
//	  go build -o go-mutex bench/peers/go_mutex.go
//
//	go-mutex -endpoint 127.0.0.1:2379 -scenario cycles -seconds 3
//	    one client and session, Lock then Unlock in a loop; prints
//	    {"cycles":N,"seconds":S,"cycles_per_sec":R}
//	go-mutex -endpoint ... -scenario worker -proc P -threads T -hold-us H \
//	    -start-at NS -seconds S
//	    T goroutines, each with a client, a session and a Mutex of its own
//	    (a Mutex on a shared session is not exclusive), take turns from
//	    CLOCK_MONOTONIC time NS on; prints the holds as a JSON array of
//	    [acq_ns, rel_ns, proc, thread, req_ns]
//	-watch-from-next: a diagnostic, not concurrency.Mutex: the same Lock
//	    (its Txn, then waitDeletes) except that each wait watches from the
//	    revision after its Get's (Go watches from the Get's own revision,
//	    clientv3/concurrency/key.go, which etcd's server treats as a watcher
//	    behind the store and catches up on its 100 ms sync loop); Unlock is
//	    Go's.
//
// Times are CLOCK_MONOTONIC, as dlock-bench's and Python's time.monotonic_ns().
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.etcd.io/etcd/mvcc/mvccpb"
	"golang.org/x/sys/unix"
)

func now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// spin busy-waits: a critical section that does not give the CPU away.
func spin(us int) {
	until := now() + int64(us)*1000
	for now() < until {
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "go-mutex: "+format+"\n", args...)
	os.Exit(1)
}

type locker struct {
	cli *clientv3.Client
	s   *concurrency.Session
	m   *concurrency.Mutex
	// -watch-from-next: Lock is lockFromNext, Unlock a Delete of key.
	fromNext bool
	pfx, key string
}

var watchFromNext = flag.Bool("watch-from-next", false,
	"diagnostic: waits watch from the revision after their Get's, not from it (see above)")

// lockFromNext is concurrency.Mutex.Lock (etcd 3.4, mutex.go) with
// waitDeletes (key.go) inlined, its watch starting at the Get's revision + 1.
func (l *locker) lockFromNext(ctx context.Context) error {
	l.key = fmt.Sprintf("%s%x", l.pfx, l.s.Lease())
	cmp := clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)
	put := clientv3.OpPut(l.key, "", clientv3.WithLease(l.s.Lease()))
	get := clientv3.OpGet(l.key)
	getOwner := clientv3.OpGet(l.pfx, clientv3.WithFirstCreate()...)
	resp, err := l.cli.Txn(ctx).If(cmp).Then(put, getOwner).Else(get, getOwner).Commit()
	if err != nil {
		return err
	}
	myRev := resp.Header.Revision
	if !resp.Succeeded {
		myRev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	}
	owner := resp.Responses[1].GetResponseRange().Kvs
	if len(owner) == 0 || owner[0].CreateRevision == myRev {
		return nil
	}
	getOpts := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(myRev-1))
	for {
		r, err := l.cli.Get(ctx, l.pfx, getOpts...)
		if err != nil {
			return err
		}
		if len(r.Kvs) == 0 {
			return nil
		}
		cctx, cancel := context.WithCancel(ctx)
		wch := l.cli.Watch(cctx, string(r.Kvs[0].Key), clientv3.WithRev(r.Header.Revision+1))
	wait:
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					break wait
				}
			}
		}
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

func newLocker(endpoint, name string) *locker {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		fail("connect: %v", err)
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		fail("session: %v", err)
	}
	return &locker{cli: cli, s: s, m: concurrency.NewMutex(s, name), fromNext: *watchFromNext, pfx: name + "/"}
}

func (l *locker) lock() {
	lock := l.m.Lock
	if l.fromNext {
		lock = l.lockFromNext
	}
	if err := lock(context.Background()); err != nil {
		fail("lock: %v", err)
	}
}

func (l *locker) unlock() {
	if l.fromNext {
		if _, err := l.cli.Delete(context.Background(), l.key); err != nil {
			fail("unlock: %v", err)
		}
		return
	}
	if err := l.m.Unlock(context.Background()); err != nil {
		fail("unlock: %v", err)
	}
}

func (l *locker) close() {
	l.s.Close()
	l.cli.Close()
}

func main() {
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "etcd client endpoint host:port")
	scenario := flag.String("scenario", "cycles", "cycles | worker")
	name := flag.String("name", "bench/go-mutex", "lock name (Go's prefix, without the trailing slash)")
	seconds := flag.Float64("seconds", 2, "time budget")
	maxOps := flag.Int64("max-ops", 1000000, "cycle / hold budget")
	proc := flag.Int("proc", 0, "this process's number (worker)")
	threads := flag.Int("threads", 1, "goroutines, each with its own client and session (worker)")
	holdUs := flag.Int("hold-us", 0, "critical section, busy-waited (worker)")
	startAt := flag.Int64("start-at", 0, "CLOCK_MONOTONIC ns at which the workers start (worker)")
	flag.Parse()

	out := json.NewEncoder(os.Stdout)
	switch *scenario {
	case "cycles":
		l := newLocker(*endpoint, *name)
		for i := 0; i < 10; i++ { // warm up, as the other drivers do
			l.lock()
			l.unlock()
		}
		var n int64
		start := now()
		until := start + int64(*seconds*1e9)
		for n < *maxOps && now() < until {
			l.lock()
			l.unlock()
			n++
		}
		s := float64(now()-start) / 1e9
		l.close()
		out.Encode(map[string]interface{}{"cycles": n, "seconds": s, "cycles_per_sec": float64(n) / s})
	case "worker":
		var mu sync.Mutex
		recs := [][5]int64{}
		var wg sync.WaitGroup
		for t := 0; t < *threads; t++ {
			wg.Add(1)
			go func(t int) {
				defer wg.Done()
				l := newLocker(*endpoint, *name)
				defer l.close()
				for now() < *startAt {
					time.Sleep(time.Millisecond)
				}
				end := *startAt + int64(*seconds*1e9)
				for now() < end {
					mu.Lock()
					n := int64(len(recs))
					mu.Unlock()
					if n >= *maxOps {
						break
					}
					req := now()
					l.lock()
					acq := now()
					spin(*holdUs)
					rel := now()
					l.unlock()
					mu.Lock()
					recs = append(recs, [5]int64{acq, rel, int64(*proc), int64(t), req})
					mu.Unlock()
				}
			}(t)
		}
		wg.Wait()
		out.Encode(recs)
	default:
		fail("unknown scenario %q", *scenario)
	}
}
