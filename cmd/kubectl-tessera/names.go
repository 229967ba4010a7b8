package main

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/manifests"
	configv1 "github.com/tessera-gpu/tessera/pkg/apis/config/v1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// schedulerDeployment is the installed scheduler's Deployment.
const schedulerDeployment = "tessera-scheduler"

// schedulerResourceNames reads the resource names the installed scheduler
// is configured with (the hami-names overlay gives HAMi's): from the
// configuration in the ConfigMap its Deployment in namespace mounts.
func schedulerResourceNames(ctx context.Context, client kubernetes.Interface, namespace string) (gpuinfo.ResourceNames, error) {
	d, err := client.AppsV1().Deployments(namespace).Get(ctx, schedulerDeployment, metav1.GetOptions{})
	if err != nil {
		return gpuinfo.ResourceNames{}, fmt.Errorf("the scheduler's Deployment %s/%s: %w", namespace, schedulerDeployment, err)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap == nil || !strings.HasPrefix(v.ConfigMap.Name, manifests.SchedulerConfigMap) {
			continue
		}
		cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			return gpuinfo.ResourceNames{}, fmt.Errorf("the scheduler's configuration: %w", err)
		}
		names, err := configv1.ResourceNamesIn([]byte(cm.Data[manifests.SchedulerConfigKey]))
		if err != nil {
			return gpuinfo.ResourceNames{}, fmt.Errorf("ConfigMap %s/%s: %w", namespace, cm.Name, err)
		}
		return names, nil
	}
	return gpuinfo.ResourceNames{}, fmt.Errorf("the scheduler's Deployment %s/%s mounts no ConfigMap %s-*", namespace, schedulerDeployment, manifests.SchedulerConfigMap)
}
