// kube-scheduler with one out-of-tree plugin, Coscheduling (gang admission through a
// scheduling.x-k8s.io PodGroup), registered through kube-scheduler's app.WithPlugin.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	// Registers CoschedulingArgs, so the profile's pluginConfig decodes.
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/coscheduling"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(coscheduling.Name, coscheduling.New))))
}
