// paho-load: MQTT publishers built on Eclipse Paho for Go, as devices use it: each connection
// publishes one reading and waits for its PUBACK (QoS 1) before the next.
//
// Burst mode (default): -conns connections publish -messages readings in all, as fast as
// one in flight allows. Fleet mode (-interval > 0): -conns connections are opened first
// ("connected N" on stdout), then, after a line on stdin, each publishes one reading every
// -interval for -duration. Either way the last line on stdout is one JSON object with the
// counts, the rate and the publish-to-acknowledgement latencies.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

type result struct {
	Conns   int     `json:"conns"`
	Sent    int64   `json:"sent"`
	Acked   int64   `json:"acked"`
	Errors  int64   `json:"errors"`
	Secs    float64 `json:"secs"`
	Rate    float64 `json:"rate"`
	MeanMs  float64 `json:"mean_ms"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	FirstEr string  `json:"first_error,omitempty"`
}

func main() {
	broker := flag.String("broker", "tcp://127.0.0.1:1883", "broker URL")
	conns := flag.Int("conns", 8, "connections")
	messages := flag.Int("messages", 100000, "readings in all (burst mode)")
	qos := flag.Int("qos", 1, "QoS of the readings (0 or 1); at QoS 0 each connection's last reading is QoS 1")
	topic := flag.String("topic", "/bench/readings", "topic")
	interval := flag.Duration("interval", 0, "fleet mode: one reading per connection every interval")
	duration := flag.Duration("duration", 10*time.Second, "fleet mode: how long the fleet publishes")
	user := flag.String("user", "", "user name")
	pass := flag.String("password", "", "password")
	flag.Parse()

	var (
		sent, acked, errs atomic.Int64
		firstErr          atomic.Value
		mu                sync.Mutex
		lat               []time.Duration
	)
	fail := func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	clients := make([]mqtt.Client, *conns)
	var wg sync.WaitGroup
	// Connect a bounded number at a time, as a fleet reconnecting would.
	gate := make(chan struct{}, 64)
	for c := 0; c < *conns; c++ {
		wg.Add(1)
		gate <- struct{}{}
		go func(c int) {
			defer wg.Done()
			defer func() { <-gate }()
			o := mqtt.NewClientOptions().AddBroker(*broker).
				SetClientID(fmt.Sprintf("paho-%d-%d", os.Getpid(), c)).
				SetCleanSession(true).SetAutoReconnect(false).
				SetKeepAlive(60 * time.Second).SetConnectTimeout(30 * time.Second).
				SetWriteTimeout(30 * time.Second).SetOrderMatters(false)
			if *user != "" {
				o.SetUsername(*user).SetPassword(*pass)
			}
			cl := mqtt.NewClient(o)
			t := cl.Connect()
			if !t.WaitTimeout(60*time.Second) || t.Error() != nil {
				fail(fmt.Errorf("connect %d: %v", c, t.Error()))
				return
			}
			clients[c] = cl
		}(c)
	}
	wg.Wait()
	up := 0
	for _, cl := range clients {
		if cl != nil {
			up++
		}
	}
	fmt.Printf("connected %d\n", up)
	if *interval > 0 {
		// Wait for the go-ahead (the runner measures the idle fleet first).
		bufio.NewReader(os.Stdin).ReadString('\n')
	}

	publish := func(cl mqtt.Client, c, seq int, q byte) {
		payload := fmt.Sprintf(`{"device":"dev-%d","seq":%d,"temp":%.1f}`, c, seq, 20+float64(seq%100)/10)
		start := time.Now()
		sent.Add(1)
		t := cl.Publish(*topic, q, false, payload)
		if !t.WaitTimeout(60*time.Second) || t.Error() != nil {
			fail(fmt.Errorf("publish: %v", t.Error()))
			return
		}
		if q > 0 {
			d := time.Since(start)
			acked.Add(1)
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
		}
	}
	started := time.Now()
	for c, cl := range clients {
		if cl == nil {
			continue
		}
		wg.Add(1)
		go func(c int, cl mqtt.Client) {
			defer wg.Done()
			if *interval > 0 {
				// Spread the fleet's first readings over one interval.
				time.Sleep(time.Duration(int64(*interval) * int64(c) / int64(*conns)))
				tick := time.NewTicker(*interval)
				defer tick.Stop()
				end := started.Add(*duration)
				for seq := 0; time.Now().Before(end); seq++ {
					publish(cl, c, seq, byte(*qos))
					<-tick.C
				}
				return
			}
			n := *messages / *conns
			for seq := 0; seq < n; seq++ {
				q := byte(*qos)
				if seq+1 == n {
					q = 1
				}
				publish(cl, c, seq, q)
			}
		}(c, cl)
	}
	wg.Wait()
	secs := time.Since(started).Seconds()
	for _, cl := range clients {
		if cl != nil {
			cl.Disconnect(0)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	r := result{Conns: up, Sent: sent.Load(), Acked: acked.Load(), Errors: errs.Load(), Secs: secs,
		Rate: float64(sent.Load()) / secs}
	if len(lat) > 0 {
		var sum time.Duration
		for _, d := range lat {
			sum += d
		}
		r.MeanMs = ms(sum / time.Duration(len(lat)))
		r.P50Ms = ms(lat[len(lat)/2])
		r.P99Ms = ms(lat[len(lat)*99/100])
	}
	if e, ok := firstErr.Load().(string); ok {
		r.FirstEr = e
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}
