// etcd server built from its upstream module. etcd's own server/go.mod replaces its sibling
// modules with relative paths, so `go install` cannot build it; this wrapper requires the tagged
// release instead and calls the same entry point as upstream's server/main.go.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
