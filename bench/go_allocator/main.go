// Command go_allocator times the real structured allocator of k8s.io/dynamic-resource-allocation
// (the code kube-scheduler's DynamicResources plugin runs) on the pools FlexNPU publishes.
//
// It reads one scenario as JSON (written by bench/bench_real_allocator.py): the DeviceClasses, every
// node's ResourceSlices, the node names and one ResourceClaim spec, and places `pods` pods, one claim
// each, as the plugin does per pod: PreFilter builds one allocator from the allocated state and every
// slice, Filter calls Allocate once per node (all nodes: fewer than 100 are always all filtered). The
// pod goes to a fitting node with the fewest pods so far (as LeastAllocated spreads equal pods), its
// allocation result joins the allocated state, and the next pod follows. It prints one JSON object:
// the ns of each Allocate call, of each NewAllocator call, and the per-pod totals.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type scenario struct {
	Classes   []*resourceapi.DeviceClass    `json:"classes"`
	Slices    []*resourceapi.ResourceSlice  `json:"slices"`
	Nodes     []string                      `json:"nodes"`
	ClaimSpec resourceapi.ResourceClaimSpec `json:"claimSpec"`
	// ClaimSpecs, when set, replaces ClaimSpec: pod p asks for ClaimSpecs[p % len] (mixed kinds).
	ClaimSpecs []resourceapi.ResourceClaimSpec `json:"claimSpecs"`
	Pods       int                             `json:"pods"`
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// features as kube-scheduler v1.36 derives them from its gates: "default" (ListTypeAttributes is
// alpha and off) or "all" (every DRA gate on, as in the measurement of dra-contracts section 7).
func features(set string) (structured.Features, cel.Features, error) {
	f := structured.Features{
		AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
		DeviceBindingAndStatus: true, ConsumableCapacity: true,
	}
	switch set {
	case "default":
	case "all":
		f.ListTypeAttributes = true
	default:
		return f, cel.Features{}, fmt.Errorf("--features: %q is neither default nor all", set)
	}
	return f, cel.Features{EnableConsumableCapacity: true, EnableListTypeAttributes: f.ListTypeAttributes}, nil
}

// allocated is the scheduler's view of the claims allocated so far (the plugin's allocated state).
type allocated struct {
	state structured.AllocatedState
}

func newAllocated() *allocated {
	return &allocated{state: structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}}
}

func (a *allocated) add(result *resourceapi.AllocationResult) {
	for _, r := range result.Devices.Results {
		if r.AdminAccess != nil && *r.AdminAccess {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			a.state.AllocatedDevices.Insert(id)
			continue
		}
		a.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			a.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

// clone is what PreFilter hands the allocator: a copy the allocator may not see change.
func (a *allocated) clone() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         a.state.AllocatedDevices.Clone(),
		AllocatedSharedDeviceIDs: a.state.AllocatedSharedDeviceIDs.Clone(),
		AggregatedCapacity:       a.state.AggregatedCapacity.Clone(),
	}
}

// placement is where one timed pod went: its claim spec's index, its node and the devices allocated.
type placement struct {
	Spec    int      `json:"spec"`
	Node    string   `json:"node"`
	Devices []string `json:"devices"`
}

type report struct {
	Kind           string           `json:"kind"`
	Features       string           `json:"features"`
	Nodes          int              `json:"nodes"`
	Slices         int              `json:"slices"`
	Devices        int              `json:"devices"`
	Pods           int              `json:"pods"`
	Placed         int              `json:"placed"`
	AllocateNs     []int64          `json:"allocateNs"`
	NewAllocatorNs []int64          `json:"newAllocatorNs"`
	PodNs          []int64          `json:"podNs"`
	FitNodes       []int            `json:"fitNodes"`
	DevicesPerPod  map[string]int   `json:"devicesPlaced"`
	Unplaced       []string         `json:"unplaced,omitempty"`
	Placements     []placement      `json:"placements"`
	GoVersion      string           `json:"goVersion"`
	Warmup         int              `json:"warmup"`
	Extra          map[string]int64 `json:"extra,omitempty"`
}

func run(sc *scenario, kind, featureSet string, seed int64, warmup int) (*report, error) {
	feat, celFeat, err := features(featureSet)
	if err != nil {
		return nil, err
	}
	lister := classLister{}
	for _, c := range sc.Classes {
		lister[c.Name] = c
	}
	nodes := make([]*v1.Node, len(sc.Nodes))
	for i, n := range sc.Nodes {
		nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/hostname": n}}}
	}
	devices := 0
	for _, s := range sc.Slices {
		devices += len(s.Spec.Devices)
	}
	rep := &report{
		Kind: kind, Features: featureSet, Nodes: len(nodes), Slices: len(sc.Slices), Devices: devices,
		Pods: sc.Pods, DevicesPerPod: map[string]int{}, GoVersion: runtime.Version(), Warmup: warmup,
	}
	ctx := context.Background()
	// The plugin keeps a CEL cache of 10 compiled expressions across scheduling cycles.
	celCache := cel.NewCache(10, celFeat)
	rng := rand.New(rand.NewSource(seed))
	var state *allocated
	var podsOn map[string]int
	for p := 0; p < warmup+sc.Pods; p++ {
		timed := p >= warmup
		if p == 0 || p == warmup {
			// The warm-up pods (CEL compilation, first allocations) are placed on an empty
			// cluster and then forgotten: the timed pods start from an empty cluster again.
			state, podsOn = newAllocated(), make(map[string]int)
		}
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("h%d-claim", p), Namespace: "placement",
				UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", p)),
			},
			Spec: *sc.ClaimSpec.DeepCopy(),
		}
		spec := -1
		if len(sc.ClaimSpecs) > 0 {
			spec = p % len(sc.ClaimSpecs)
			claim.Spec = *sc.ClaimSpecs[spec].DeepCopy()
		}
		podStart := time.Now()
		t0 := time.Now()
		alloc, err := structured.NewAllocator(ctx, feat, state.clone(), lister, sc.Slices, celCache)
		newNs := time.Since(t0).Nanoseconds()
		if err != nil {
			return nil, fmt.Errorf("pod %d: NewAllocator: %w", p, err)
		}
		type fit struct {
			node   string
			result resourceapi.AllocationResult
		}
		var fits []fit
		for _, node := range nodes {
			t := time.Now()
			results, err := alloc.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
			ns := time.Since(t).Nanoseconds()
			if err != nil {
				return nil, fmt.Errorf("pod %d on %s: Allocate: %w", p, node.Name, err)
			}
			if timed {
				rep.AllocateNs = append(rep.AllocateNs, ns)
			}
			if len(results) == 1 {
				fits = append(fits, fit{node.Name, results[0]})
			}
		}
		podNs := time.Since(podStart).Nanoseconds()
		if timed {
			rep.NewAllocatorNs = append(rep.NewAllocatorNs, newNs)
			rep.PodNs = append(rep.PodNs, podNs)
			rep.FitNodes = append(rep.FitNodes, len(fits))
		}
		if len(fits) == 0 {
			if timed {
				rep.Unplaced = append(rep.Unplaced, claim.Name)
			}
			continue
		}
		// Fewest pods first (equal pods under LeastAllocated), ties broken at random as the scheduler does.
		rng.Shuffle(len(fits), func(i, j int) { fits[i], fits[j] = fits[j], fits[i] })
		sort.SliceStable(fits, func(i, j int) bool { return podsOn[fits[i].node] < podsOn[fits[j].node] })
		chosen := fits[0]
		podsOn[chosen.node]++
		state.add(&chosen.result)
		if timed {
			rep.Placed++
			where := placement{Spec: spec, Node: chosen.node}
			for _, r := range chosen.result.Devices.Results {
				rep.DevicesPerPod[r.Device]++
				where.Devices = append(where.Devices, r.Device)
			}
			rep.Placements = append(rep.Placements, where)
		}
	}
	return rep, nil
}

func main() {
	in := flag.String("scenario", "", "scenario JSON (bench/bench_real_allocator.py writes it)")
	kind := flag.String("kind", "", "a label for the report")
	featureSet := flag.String("features", "default", "default (kube-scheduler v1.36 default gates) or all")
	seed := flag.Int64("seed", 1, "tie-break seed")
	warmup := flag.Int("warmup", 8, "pods placed untimed first on an empty cluster (CEL compilation, caches), then forgotten")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the timed run")
	flag.Parse()
	if *in == "" {
		fmt.Fprintln(os.Stderr, "go_allocator: --scenario FILE is required")
		os.Exit(2)
	}
	data, err := os.ReadFile(*in)
	if err != nil {
		fmt.Fprintf(os.Stderr, "go_allocator: %v\n", err)
		os.Exit(2)
	}
	var sc scenario
	if err := json.Unmarshal(data, &sc); err != nil {
		fmt.Fprintf(os.Stderr, "go_allocator: %s: %v\n", *in, err)
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "go_allocator: %v\n", err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "go_allocator: %v\n", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := run(&sc, *kind, *featureSet, *seed, *warmup)
	if err != nil {
		fmt.Fprintf(os.Stderr, "go_allocator: %v\n", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fmt.Fprintf(os.Stderr, "go_allocator: %v\n", err)
		os.Exit(1)
	}
}
