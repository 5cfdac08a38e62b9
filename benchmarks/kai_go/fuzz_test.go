package kaicycle

// TestKAIFuzz runs KAI's full cycle on many small clusters in one process, for the differential
// fuzzer (kai_ray/testing/kai_fuzz.py). $KAI_FUZZ_IN holds one cluster JSON per line, each with
// an "id"; for each, $KAI_FUZZ_RUNS (default 1) independent cycles run, and one line
// {"id": ..., "runs": [decisions, ...]} is written to $KAI_FUZZ_OUT. KAI's choices can differ
// between runs of the same cluster (Go map order, fresh GPU group ids), so the fuzzer asks for
// several and accepts any. A cluster the harness refuses, or one on which KAI's code panics,
// gets {"id": ..., "error": "..."}.
// KAI_FUZZ_LOG=N prints KAI's own logs at verbosity N.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"

	"go.uber.org/mock/gomock"

	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/cache"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/log"
)

type fuzzCase struct {
	ID string `json:"id"`
	Cluster
}

type fuzzAnswer struct {
	ID    string       `json:"id"`
	Runs  []*decisions `json:"runs,omitempty"`
	Error string       `json:"error,omitempty"`
}

func TestKAIFuzz(t *testing.T) {
	in, out := os.Getenv("KAI_FUZZ_IN"), os.Getenv("KAI_FUZZ_OUT")
	if in == "" || out == "" {
		t.Skip("set KAI_FUZZ_IN and KAI_FUZZ_OUT (kai_ray/testing/kai_fuzz.py does)")
	}
	if s := os.Getenv("KAI_FUZZ_LOG"); s != "" { // KAI's own logs at this verbosity, on stdout
		level, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("KAI_FUZZ_LOG: %q is not a verbosity level", s)
		}
		if err := log.InitLoggers(level); err != nil {
			t.Fatal(err)
		}
	}
	runs := 1
	if s := os.Getenv("KAI_FUZZ_RUNS"); s != "" {
		var err error
		if runs, err = strconv.Atoi(s); err != nil || runs < 1 {
			t.Fatalf("KAI_FUZZ_RUNS: %q is not a positive integer", s)
		}
	}
	src, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	w := bufio.NewWriter(dst)
	defer w.Flush()
	lines := bufio.NewScanner(src)
	lines.Buffer(make([]byte, 1<<20), 64<<20)
	for lines.Scan() {
		var c fuzzCase
		answer := fuzzAnswer{}
		if err := json.Unmarshal(lines.Bytes(), &c); err != nil {
			answer.Error = err.Error()
		} else if err := c.validate(); err != nil {
			answer.ID, answer.Error = c.ID, err.Error()
		} else {
			answer.ID = c.ID
			for i := 0; i < runs && answer.Error == ""; i++ {
				log, err := fuzzCycle(t, &c.Cluster)
				if err != nil {
					answer.Error, answer.Runs = err.Error(), nil
				} else {
					answer.Runs = append(answer.Runs, log)
				}
			}
		}
		data, _ := json.Marshal(answer)
		w.Write(append(data, '\n'))
	}
	if err := lines.Err(); err != nil {
		t.Fatal(err)
	}
}

// fuzzCycle is runCycle without timing: the actions run in this goroutine, so that a panic in
// KAI's code is one case's error rather than the end of the batch.
func fuzzCycle(t *testing.T, c *Cluster) (log *decisions, err error) {
	ctrl := gomock.NewController(t)
	defer ctrl.Finish()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("KAI panicked: %v", r)
		}
	}()
	ssn := buildSession(c.Topology(), ctrl, &runResult{})
	schedulerDefaults(ssn)
	count := &counter{log: &decisions{}}
	expectCounted(ssn.Cache.(*cache.MockCache), count)
	for _, action := range selectedActions(t) {
		action.Execute(ssn)
	}
	return count.log, nil
}
