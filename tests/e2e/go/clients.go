// Command clients drives one Sluice broker with two Go Kafka clients as Debian packages
// them (sarama and kafka-go, built in GOPATH mode): each produces records to its own
// topic, consumes them in a consumer group and commits. It prints one line per client,
// "<client> consumed=<n>", and exits non-zero on any error. The pytest side
// (test_go_clients.py) checks the committed offsets with another client.
//
// Usage: clients <broker addr> <sarama topic> <sarama group> <kafka-go topic> <kafka-go group> <n>
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/Shopify/sarama"
	kafka "github.com/segmentio/kafka-go"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

// handler consumes until it has seen n messages, marking each for commit.
type handler struct {
	n    int
	seen int
	done chan struct{}
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		s.MarkMessage(m, "")
		h.seen++
		if h.seen == h.n {
			close(h.done)
			return nil
		}
	}
	return nil
}

func runSarama(addr, topic, group string, n int) {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_0_0_0
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.CommitInterval = 100 * time.Millisecond
	p, err := sarama.NewSyncProducer([]string{addr}, cfg)
	if err != nil {
		fail("sarama producer: %v", err)
	}
	for i := 0; i < n; i++ {
		msg := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder("k" + strconv.Itoa(i)),
			Value: sarama.StringEncoder("sarama " + strconv.Itoa(i))}
		if _, _, err := p.SendMessage(msg); err != nil {
			fail("sarama send: %v", err)
		}
	}
	p.Close()
	g, err := sarama.NewConsumerGroup([]string{addr}, group, cfg)
	if err != nil {
		fail("sarama group: %v", err)
	}
	go func() {
		for err := range g.Errors() {
			fmt.Fprintf(os.Stderr, "sarama group error: %v\n", err)
		}
	}()
	h := &handler{n: n, done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{topic}, h); err != nil {
				fmt.Fprintf(os.Stderr, "sarama consume: %v\n", err)
				time.Sleep(200 * time.Millisecond)
			}
		}
	}()
	select {
	case <-h.done:
	case <-ctx.Done():
		fail("sarama: consumed %d of %d", h.seen, n)
	}
	// Closing the group commits the marked offsets.
	if err := g.Close(); err != nil {
		fail("sarama close: %v", err)
	}
	fmt.Printf("sarama consumed=%d\n", h.seen)
}

func runKafkaGo(addr, topic, group string, n int) {
	w := kafka.NewWriter(kafka.WriterConfig{Brokers: []string{addr}, Topic: topic,
		RequiredAcks: -1, BatchTimeout: 10 * time.Millisecond})
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte("k" + strconv.Itoa(i)), Value: []byte("kafka-go " + strconv.Itoa(i))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		fail("kafka-go write: %v", err)
	}
	w.Close()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, GroupID: group,
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
	seen := 0
	for seen < n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			fail("kafka-go fetch after %d: %v", seen, err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			fail("kafka-go commit: %v", err)
		}
		seen++
	}
	if err := r.Close(); err != nil {
		fail("kafka-go close: %v", err)
	}
	fmt.Printf("kafka-go consumed=%d\n", seen)
}

func main() {
	if len(os.Args) != 7 {
		fail("usage: clients <addr> <sarama topic> <sarama group> <kafka-go topic> <kafka-go group> <n>")
	}
	n, err := strconv.Atoi(os.Args[6])
	if err != nil {
		fail("n: %v", err)
	}
	runSarama(os.Args[1], os.Args[2], os.Args[3], n)
	runKafkaGo(os.Args[1], os.Args[4], os.Args[5], n)
}
