package main

import (
	"strconv"
	"testing"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// The demo on a three-master Redis Cluster, given the seed nodes in go-redis's cluster
// URL form, or one node's plain URL (a cluster node is found out at start-up, also
// for a user with only the ACL that docs/FAILURE.md gives a cluster's user): six
// clients, whose budgets spread over the masters, each get exactly the limit, and the
// report route, whose account and route budgets live in different slots, admits and
// refuses as on one server. No request gets a 503.
func TestDemoOnCluster(t *testing.T) {
	_, nodes := redistest.StartCluster(t, 3)
	setACLUser(t, true, nodes...)
	for name, url := range map[string]string{
		"Seeds":          "redis://" + nodes[0].Addr + "?addr=" + nodes[1].Addr + "&addr=" + nodes[2].Addr,
		"OneNode":        "redis://" + nodes[1].Addr,
		"OneNodeDB":      "redis://" + nodes[2].Addr + "/0",
		"OneNodeACLUser": "redis://limiter:pw@" + nodes[0].Addr,
	} {
		t.Run(name, func(t *testing.T) {
			for _, n := range nodes {
				if err := n.Client(t).FlushAll(t.Context()).Err(); err != nil {
					t.Fatal(err)
				}
			}
			demoOnCluster(t, nodes, url)
		})
	}
}

func demoOnCluster(t *testing.T, nodes []*redistest.Server, url string) {
	checkDemoOnCluster(t, startDemo(t, "-redis", url, "-limit", "3", "-window", "1m", "-store-timeout", "2s", "-trusted-proxies", "127.0.0.1/32"), nodes)
}

// checkDemoOnCluster checks the demo at base, run with -limit 3 -window 1m on the
// cluster of nodes, as TestDemoOnCluster says.
func checkDemoOnCluster(t *testing.T, base string, nodes []*redistest.Server) {
	t.Helper()
	for ip := 1; ip <= 6; ip++ {
		for i, want := range []int{200, 200, 200, 429} {
			resp := get(t, "GET", base+"/api/hello", map[string]string{"X-Forwarded-For": "203.0.113." + strconv.Itoa(ip)})
			if resp.StatusCode != want {
				t.Fatalf("client %d request %d: %d, want %d", ip, i, resp.StatusCode, want)
			}
		}
	}
	for _, key := range []string{"key-a", "key-b"} {
		for i, want := range []int{200, 200, 200, 429} {
			resp := get(t, "GET", base+"/api/accounts/7/report", map[string]string{"X-API-Key": key})
			if resp.StatusCode != want {
				t.Fatalf("%s report %d: %d, want %d", key, i, resp.StatusCode, want)
			}
		}
	}
	// The budgets really are spread over the masters.
	holding := 0
	for _, n := range nodes {
		keys, err := n.Client(t).Keys(t.Context(), "rb-demo:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			holding++
		}
	}
	if holding < 2 {
		t.Fatalf("the demo's budgets are on %d of 3 masters", holding)
	}
}
