package testenv

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, IgnoreLeaks()...)
}

func TestStartEtcd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, cli := StartEtcd(t)
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("put: %v", err)
	}
	r, err := cli.Get(ctx, "/k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("get = %v, %v; want v", r, err)
	}
}

func TestStartNATS(t *testing.T) {
	url := StartNATS(t)
	nc := ConnectNATS(t, url)
	sub, err := nc.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("x", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil || string(m.Data) != "hi" {
		t.Fatalf("got %v, %v; want hi", m, err)
	}
}
