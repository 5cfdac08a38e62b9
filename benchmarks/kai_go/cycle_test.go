package kaicycle

// TestKAICycle runs one KAI scheduling cycle (allocate, consolidation, reclaim, preempt,
// stalegangeviction) on the cluster in $KAI_CYCLE_JSON, $KAI_CYCLE_REPEAT times (default 1),
// and prints one line per run: "KAI_CYCLE_RESULT {json}". Skipped without $KAI_CYCLE_JSON.
//
//	KAI_CYCLE_JSON=/tmp/c.json go test -run TestKAICycle -v -timeout 0 .
//
// Optional: KAI_CYCLE_DECISIONS=path writes the last run's binds, pipelined pods and evictions
// as JSON; KAI_CYCLE_PARAMS=test keeps the scheduler parameters of KAI's test sessions
// (unlimited consolidation preemptees, no scheduling signatures) instead of the scheduler's
// command-line defaults; KAI_CYCLE_BUILD=BuildSession builds the session with one call of
// test_utils.BuildSession (snapshot time then not split); KAI_CYCLE_ACTIONS=allocate,preempt
// runs only those actions (in KAI's order); KAI_CYCLE_TIMEOUT=seconds stops a run whose actions
// take longer: it prints the result so far, the unfinished action marked "timed_out", and exits.

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/mock/gomock"
	v1 "k8s.io/api/core/v1"

	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/actions/allocate"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/actions/consolidation"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/actions/preempt"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/actions/reclaim"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/actions/stalegangeviction"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/common_info"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/eviction_info"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/pod_info"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/pod_status"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/podgroup_info"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/resource_info"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/cache"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/cache/cluster_info"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/conf"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/framework"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/test_utils"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/test_utils/jobs_fake"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/test_utils/nodes_fake"
)

func init() {
	test_utils.InitTestingInfrastructure()
}

type actionResult struct {
	Name      string  `json:"name"`
	Seconds   float64 `json:"seconds"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	Binds     int     `json:"binds"`
	Pipelined int     `json:"pipelined"`
	Evictions int     `json:"evictions"`
}

type runResult struct {
	Nodes   int            `json:"nodes"`
	Pods    int            `json:"pods"`
	Pending int            `json:"pending"`
	Build   string         `json:"build"`
	Params  string         `json:"params"`
	Objects float64        `json:"objects_s"` // jobs/tasks/nodes/queues infos (-1: not split)
	Mock    float64        `json:"mock_s"`    // cache mock and its informers (test scaffolding)
	Open    float64        `json:"open_s"`    // plugins' OnSessionOpen
	Session float64        `json:"session_s"` // objects + open: the snapshot (mock excluded)
	Actions []actionResult `json:"actions"`
	Total   float64        `json:"total_s"` // session + actions
	// the action that did not finish within KAI_CYCLE_TIMEOUT (its seconds are a lower bound)
	TimedOut string `json:"timed_out,omitempty"`
	// from the cache mock's calls
	Binds     int `json:"binds"`
	Pipelined int `json:"pipelined"`
	Evictions int `json:"evictions"`
	// pods by final status in the session (Binding, Pipelined, Releasing, ...)
	Final   map[string]int `json:"final_status"`
	HeapMiB float64        `json:"heap_mib"`
	PeakRSS float64        `json:"peak_rss_mib"` // of the process so far (VmHWM; -1 if unknown)
}

type decisions struct {
	Binds     [][]string `json:"binds"`     // pod, node, gpu groups...
	Pipelined [][]string `json:"pipelined"` // pod, node, gpu groups...
	Evictions []string   `json:"evictions"`
	// the same calls in the order they were made: "bind"/"pipeline"/"evict", pod, node
	Events [][]string `json:"events"`
}

type counter struct {
	binds, pipelined, evictions int
	log                         *decisions
}

func TestKAICycle(t *testing.T) {
	path := os.Getenv("KAI_CYCLE_JSON")
	if path == "" {
		t.Skip("set KAI_CYCLE_JSON to a cluster JSON file (benchmarks/kai_cycle.py writes one)")
	}
	repeat := 1
	if s := os.Getenv("KAI_CYCLE_REPEAT"); s != "" {
		var err error
		if repeat, err = strconv.Atoi(s); err != nil || repeat < 1 {
			t.Fatalf("KAI_CYCLE_REPEAT: %q is not a positive integer", s)
		}
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < repeat; i++ {
		runtime.GC()
		res, log := runCycle(t, c)
		line, _ := json.Marshal(res)
		fmt.Printf("KAI_CYCLE_RESULT %s\n", line)
		if out := os.Getenv("KAI_CYCLE_DECISIONS"); out != "" && i == repeat-1 {
			data, _ := json.Marshal(log)
			if err := os.WriteFile(out, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func runCycle(t *testing.T, c *Cluster) (*runResult, *decisions) {
	topo := c.Topology()
	ctrl := gomock.NewController(t)
	defer ctrl.Finish()
	res := &runResult{Nodes: len(c.Nodes), Build: "steps", Params: "scheduler", Objects: -1,
		Mock: -1, Final: map[string]int{}}
	for _, j := range c.Jobs {
		res.Pods += len(j.Pods)
		for _, p := range j.Pods {
			if p.Status == "Pending" {
				res.Pending++
			}
		}
	}

	var ssn *framework.Session
	if os.Getenv("KAI_CYCLE_BUILD") == "BuildSession" {
		res.Build = "BuildSession"
		start := time.Now()
		ssn = test_utils.BuildSession(topo, ctrl)
		recountAllocated(ssn.PodGroupInfos)
		res.Open = time.Since(start).Seconds()
		res.Session = res.Open
	} else {
		ssn = buildSession(topo, ctrl, res)
		res.Session = res.Objects + res.Open
	}

	if os.Getenv("KAI_CYCLE_PARAMS") == "test" {
		res.Params = "test"
	} else {
		schedulerDefaults(ssn)
	}
	count := &counter{log: &decisions{}}
	expectCounted(ssn.Cache.(*cache.MockCache), count)

	actions := selectedActions(t)
	var limit <-chan time.Time
	if s := os.Getenv("KAI_CYCLE_TIMEOUT"); s != "" {
		seconds, err := strconv.ParseFloat(s, 64)
		if err != nil || seconds <= 0 {
			t.Fatalf("KAI_CYCLE_TIMEOUT: %q is not a positive number of seconds", s)
		}
		limit = time.After(time.Duration(seconds * float64(time.Second)))
	}
	// the actions run in one goroutine; this one reports what finished if the limit comes first
	finished := make(chan actionResult)
	go func() {
		for _, action := range actions {
			b, p, e := count.binds, count.pipelined, count.evictions
			began := time.Now()
			action.Execute(ssn)
			finished <- actionResult{
				Name: string(action.Name()), Seconds: time.Since(began).Seconds(),
				Binds: count.binds - b, Pipelined: count.pipelined - p, Evictions: count.evictions - e,
			}
		}
		close(finished)
	}()
	actionStart := time.Now()
	lastDone := actionStart
	for len(res.Actions) < len(actions) {
		select {
		case a := <-finished:
			res.Actions = append(res.Actions, a)
			res.Binds += a.Binds
			res.Pipelined += a.Pipelined
			res.Evictions += a.Evictions
			lastDone = time.Now()
		case <-limit:
			name := string(actions[len(res.Actions)].Name())
			res.Actions = append(res.Actions, actionResult{
				Name: name, Seconds: time.Since(lastDone).Seconds(), TimedOut: true})
			res.TimedOut = name
			res.Total = res.Session + time.Since(actionStart).Seconds()
			res.PeakRSS = peakRSSMiB()
			line, _ := json.Marshal(res)
			fmt.Printf("KAI_CYCLE_RESULT %s\n", line)
			os.Exit(0) // the action cannot be interrupted
		}
	}
	res.Total = res.Session + time.Since(actionStart).Seconds()

	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	res.HeapMiB = float64(mem.HeapAlloc) / (1 << 20)
	res.PeakRSS = peakRSSMiB()
	for _, job := range ssn.PodGroupInfos {
		for _, task := range job.GetAllPodsMap() {
			res.Final[task.Status.String()]++
		}
	}
	return res, count.log
}

// schedulerDefaults sets kai-scheduler's command-line defaults (cmd/scheduler/app/options),
// which differ from the test session's (-1 preemptees, no signatures, no staleness grace period).
func schedulerDefaults(ssn *framework.Session) {
	ssn.OverrideMaxNumberConsolidationPreemptees(16)
	ssn.SchedulerParams.UseSchedulingSignatures = true
	ssn.OverrideAllowConsolidatingReclaim(true)
	ssn.OverrideGlobalDefaultStalenessGracePeriod(60 * time.Second)
}

func selectedActions(t *testing.T) []framework.Action {
	all := []framework.Action{ // kai-scheduler's default order
		allocate.New(), consolidation.New(), reclaim.New(), preempt.New(), stalegangeviction.New(),
	}
	names := os.Getenv("KAI_CYCLE_ACTIONS")
	if names == "" {
		return all
	}
	wanted := map[string]bool{}
	for _, name := range strings.Split(names, ",") {
		wanted[strings.TrimSpace(name)] = true
	}
	var chosen []framework.Action
	for _, action := range all {
		if wanted[string(action.Name())] {
			chosen = append(chosen, action)
			delete(wanted, string(action.Name()))
		}
	}
	if len(wanted) > 0 {
		t.Fatalf("KAI_CYCLE_ACTIONS: unknown actions %v", wanted)
	}
	return chosen
}

// buildSession does what test_utils.BuildSession and CreateFakeSession do, timing apart the
// objects, the cache mock (test scaffolding: its informers wait ~0.1 s to sync) and the plugins'
// session open, and sets each job's Allocated from its tasks as KAI's cluster snapshot does (the
// test builder counts only the first fractional pod of each node).
func buildSession(topo test_utils.TestTopologyBasic, ctrl *gomock.Controller, res *runResult) *framework.Session {
	tiers := test_utils.BuildPlugins(topo) // KAI's default scheduler configuration
	start := time.Now()
	jobs, tasksByNode, _ := jobs_fake.BuildJobsAndTasksMaps(topo.Jobs)
	recountAllocated(jobs)
	// on a cluster a pod carries its priority class's value, which is part of KAI's scheduling
	// signature (which failed job lets an action skip another); the test builder sets none
	for _, job := range jobs {
		for _, task := range job.GetAllPodsMap() {
			priority := job.Priority
			task.Pod.Spec.Priority = &priority
		}
	}
	affinity := cache.NewK8sClusterPodAffinityInfo()
	nodes := nodes_fake.BuildNodesInfoMap(topo.Nodes, tasksByNode, affinity)
	queues := test_utils.BuildQueueInfoMap(topo)
	for id, dept := range test_utils.BuildDepartmentInfoMap(topo) {
		queues[id] = dept
	}
	cluster_info.UpdateQueueHierarchy(queues)
	res.Objects = time.Since(start).Seconds()

	ssn := &framework.Session{
		Nodes:         nodes,
		Config:        &conf.SchedulerConfiguration{Tiers: tiers},
		Queues:        queues,
		PodGroupInfos: jobs,
		Topologies:    topo.Topologies,
	}
	ssn.OverrideMaxNumberConsolidationPreemptees(-1)
	ssn.OverrideAllowConsolidatingReclaim(true)
	ssn.OverrideSchedulerName("kai-scheduler")
	start = time.Now()
	ssn.Cache = test_utils.GetTestCacheMock(ctrl, topo.Mocks, nil, affinity)
	res.Mock = time.Since(start).Seconds()

	start = time.Now()
	for _, tier := range tiers {
		for _, option := range tier.Plugins {
			builder, found := framework.GetPluginBuilder(option.Name)
			if !found {
				panic("KAI has no plugin " + option.Name)
			}
			builder(option.Arguments).OnSessionOpen(ssn)
		}
	}
	res.Open = time.Since(start).Seconds()
	return ssn
}

func recountAllocated(jobs map[common_info.PodGroupID]*podgroup_info.PodGroupInfo) {
	for _, job := range jobs {
		allocated := resource_info.EmptyResource()
		for _, task := range job.GetAllPodsMap() {
			if pod_status.AllocatedStatus(task.Status) {
				allocated.AddResourceRequirements(task.ResReq)
			}
		}
		job.Allocated = allocated
	}
}

// expectCounted lets the cache mock accept any number of binds, evictions and pipelined pods,
// counting them (the test utilities' own expectations are upper bounds, not counts).
func expectCounted(mock *cache.MockCache, count *counter) {
	mock.EXPECT().Bind(gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(
		func(pod *pod_info.PodInfo, node string, _ map[string]string) error {
			count.binds++
			count.log.Binds = append(count.log.Binds, append([]string{pod.Name, node}, pod.GPUGroups...))
			count.log.Events = append(count.log.Events, []string{"bind", pod.Name, node})
			return nil
		}).AnyTimes()
	mock.EXPECT().Evict(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(
		func(pod *v1.Pod, _ *podgroup_info.PodGroupInfo, _ eviction_info.EvictionMetadata, _ string) error {
			count.evictions++
			count.log.Evictions = append(count.log.Evictions, pod.Name)
			count.log.Events = append(count.log.Events, []string{"evict", pod.Name, pod.Spec.NodeName})
			return nil
		}).AnyTimes()
	mock.EXPECT().TaskPipelined(gomock.Any(), gomock.Any()).Do(
		func(pod *pod_info.PodInfo, _ string) {
			count.pipelined++
			count.log.Pipelined = append(count.log.Pipelined,
				append([]string{pod.Name, pod.NodeName}, pod.GPUGroups...))
			count.log.Events = append(count.log.Events, []string{"pipeline", pod.Name, pod.NodeName})
		}).AnyTimes()
}

func peakRSSMiB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) >= 2 && fields[0] == "VmHWM:" {
			kib, err := strconv.ParseFloat(fields[1], 64)
			if err == nil {
				return kib / 1024
			}
		}
	}
	return -1
}
