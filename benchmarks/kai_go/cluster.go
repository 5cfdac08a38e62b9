// Package kaicycle times one scheduling cycle of NVIDIA's KAI scheduler (its real actions and
// plugins, in a session built with KAI's own test utilities) on a cluster read from JSON, as
// written by benchmarks/kai_cycle.py from kai_ray.sim.synthetic.cluster(N).
package kaicycle

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/api/pod_status"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/test_utils"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/test_utils/jobs_fake"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/test_utils/nodes_fake"
	"github.com/NVIDIA/KAI-scheduler/pkg/scheduler/test_utils/tasks_fake"
)

// Cluster is the JSON schema (see benchmarks/kai_cycle.py). Quantities use kai_ray's units:
// CPU in millicores, memory in bytes, GPU memory in MiB.
type Cluster struct {
	Nodes  []Node  `json:"nodes"`
	Queues []Queue `json:"queues"`
	Jobs   []Job   `json:"jobs"`
}

type Node struct {
	Name         string `json:"name"`
	CPUMilli     int64  `json:"cpu_m"`
	Memory       int64  `json:"memory"`
	GPUs         int    `json:"gpus"`
	GPUMemoryMiB int    `json:"gpu_memory_mib"`
	MaxPods      int    `json:"max_pods"`
}

// Queue: a queue without parent is a top-level queue (a KAI department in the test utilities);
// quotas and limits of -1 mean unlimited. CPU and memory quotas are always unlimited here.
type Queue struct {
	Name               string  `json:"name"`
	Parent             string  `json:"parent"`
	GPUQuota           float64 `json:"gpu_quota"`
	GPULimit           float64 `json:"gpu_limit"`
	GPUOverQuotaWeight float64 `json:"gpu_over_quota_weight"`
}

// Job is a PodGroup whose pods all make the same request (KAI's test jobs are homogeneous).
type Job struct {
	Name      string  `json:"name"`
	Queue     string  `json:"queue"`
	Priority  int32   `json:"priority"`
	MinMember int     `json:"min_member"`
	Created   float64 `json:"created"`
	Request   Request `json:"request"`
	Pods      []Pod   `json:"pods"`
}

type Request struct {
	CPUMilli         int64 `json:"cpu_m"`
	Memory           int64 `json:"memory"`
	GPUs             int   `json:"gpus"`
	GPUFractionMilli int   `json:"gpu_fraction_milli"`
}

// Pod: status "Pending", "Running" or "Releasing" (then node is set: a releasing pod is being
// deleted and still holds its resources); gpu_groups names the shared device of a placed
// fractional pod (pods with the same group share one GPU).
type Pod struct {
	Name      string   `json:"name"`
	Status    string   `json:"status"`
	Node      string   `json:"node"`
	GPUGroups []string `json:"gpu_groups"`
}

func Load(path string) (*Cluster, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Cluster
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, c.validate()
}

func (c *Cluster) validate() error {
	nodes := map[string]bool{}
	for i, n := range c.Nodes {
		if n.Name == "" || nodes[n.Name] {
			return fmt.Errorf("nodes[%d].name: empty or repeated %q", i, n.Name)
		}
		if n.CPUMilli <= 0 || n.Memory <= 0 || n.GPUs < 0 || n.MaxPods <= 0 {
			return fmt.Errorf("node %s: cpu_m, memory and max_pods must be > 0, gpus >= 0", n.Name)
		}
		nodes[n.Name] = true
	}
	parents := map[string]string{}
	for i, q := range c.Queues {
		if _, dup := parents[q.Name]; q.Name == "" || dup {
			return fmt.Errorf("queues[%d].name: empty or repeated %q", i, q.Name)
		}
		parents[q.Name] = q.Parent
	}
	for _, q := range c.Queues {
		if q.Parent == "" {
			continue
		}
		grand, ok := parents[q.Parent]
		if !ok {
			return fmt.Errorf("queue %s: parent %q is not a queue", q.Name, q.Parent)
		}
		if grand != "" {
			return fmt.Errorf("queue %s: parent %q has a parent itself; KAI's test utilities "+
				"build two levels only (departments and queues)", q.Name, q.Parent)
		}
	}
	jobs := map[string]bool{}
	for i, j := range c.Jobs {
		if j.Name == "" || jobs[j.Name] {
			return fmt.Errorf("jobs[%d].name: empty or repeated %q", i, j.Name)
		}
		jobs[j.Name] = true
		if parent, ok := parents[j.Queue]; !ok || parent == "" {
			return fmt.Errorf("job %s: queue %q is not a leaf queue", j.Name, j.Queue)
		}
		if len(j.Pods) == 0 || j.MinMember < 1 || j.MinMember > len(j.Pods) {
			return fmt.Errorf("job %s: min_member %d with %d pods", j.Name, j.MinMember, len(j.Pods))
		}
		r := j.Request
		if r.GPUFractionMilli < 0 || r.GPUFractionMilli >= 1000 || (r.GPUFractionMilli > 0 && r.GPUs > 0) {
			return fmt.Errorf("job %s: request.gpu_fraction_milli %d (with gpus %d)", j.Name,
				r.GPUFractionMilli, r.GPUs)
		}
		for _, p := range j.Pods {
			switch p.Status {
			case "Pending":
				if p.Node != "" {
					return fmt.Errorf("job %s pod %s: a pending pod has node %q", j.Name, p.Name, p.Node)
				}
			case "Running", "Releasing":
				if !nodes[p.Node] {
					return fmt.Errorf("job %s pod %s: node %q is not a node", j.Name, p.Name, p.Node)
				}
			default:
				return fmt.Errorf("job %s pod %s: status %q (Pending, Running or Releasing)", j.Name, p.Name, p.Status)
			}
		}
	}
	return nil
}

// Topology maps the cluster to KAI's test topology. Each call builds fresh objects (KAI's
// builders modify the jobs they are given).
func (c *Cluster) Topology() test_utils.TestTopologyBasic {
	topo := test_utils.TestTopologyBasic{
		Name:  "kai-ray-synthetic",
		Nodes: map[string]nodes_fake.TestNodeBasic{},
		// a cache mock with no Bind/Evict expectations of its own: the harness adds counting ones
		Mocks: &test_utils.TestMock{CacheRequirements: &test_utils.CacheMocking{}},
	}
	for _, n := range c.Nodes {
		maxPods := n.MaxPods
		topo.Nodes[n.Name] = nodes_fake.TestNodeBasic{
			GPUs: n.GPUs,
			// the test builder parses these as Kubernetes quantities: cores and bytes
			CPUMillis:  float64(n.CPUMilli) / 1000,
			CPUMemory:  float64(n.Memory),
			GPUMemory:  n.GPUMemoryMiB,
			MaxTaskNum: &maxPods,
		}
	}
	for _, q := range c.Queues {
		if q.Parent == "" {
			topo.Departments = append(topo.Departments, test_utils.TestDepartmentBasic{
				Name: q.Name, DeservedGPUs: q.GPUQuota, MaxAllowedGPUs: q.GPULimit,
			})
			continue
		}
		topo.Queues = append(topo.Queues, test_utils.TestQueueBasic{
			Name: q.Name, ParentQueue: q.Parent, DeservedGPUs: q.GPUQuota,
			MaxAllowedGPUs: q.GPULimit, GPUOverQuotaWeight: q.GPUOverQuotaWeight,
		})
	}
	ages := ageRanks(c.Jobs)
	for _, j := range c.Jobs {
		gpus := float64(j.Request.GPUs)
		if j.Request.GPUFractionMilli > 0 {
			gpus = float64(j.Request.GPUFractionMilli) / 1000
		}
		job := &jobs_fake.TestJobBasic{
			Name:                  j.Name,
			QueueName:             j.Queue,
			Priority:              j.Priority,
			RequiredGPUsPerTask:   gpus,
			RequiredCPUsPerTask:   float64(j.Request.CPUMilli) / 1000,
			RequiredMemoryPerTask: float64(j.Request.Memory),
			JobAgeInMinutes:       ages[j.Created],
		}
		if j.MinMember != len(j.Pods) { // KAI's default min available is the number of pods
			job.RootSubGroupSet = jobs_fake.DefaultSubGroup(int32(j.MinMember))
		}
		for _, p := range j.Pods {
			task := &tasks_fake.TestTaskBasic{State: pod_status.Pending}
			if p.Status == "Running" || p.Status == "Releasing" {
				task.State = pod_status.Running
				if p.Status == "Releasing" {
					task.State = pod_status.Releasing
				}
				task.NodeName = p.Node
				task.GPUGroups = append([]string(nil), p.GPUGroups...)
			}
			job.Tasks = append(job.Tasks, task)
		}
		topo.Jobs = append(topo.Jobs, job)
	}
	return topo
}

// ageRanks gives each distinct creation time an age in minutes, oldest largest, ties equal:
// the test builder takes job ages, not timestamps.
func ageRanks(jobs []Job) map[float64]int {
	var times []float64
	seen := map[float64]bool{}
	for _, j := range jobs {
		if !seen[j.Created] {
			seen[j.Created] = true
			times = append(times, j.Created)
		}
	}
	sort.Float64s(times)
	ages := make(map[float64]int, len(times))
	for i, t := range times {
		ages[t] = len(times) - i
	}
	return ages
}
