//! The public paths that the layout of #27 (item 5) kept: the stages moved into `stages/`, the
//! metric catalogue split, the owner types into the model — and every path below still names
//! the same item. A path that stops compiling here is a breaking change for embedders.

#![allow(unused_imports)]

use gpumon_core::attribution::{
    cgroup, procfs, tenant, AllocationCache, Allocations, AttributionConfig, AttributionSummary, Attributor,
    ContainerRuntime, Criterion, Owner, OwnerLabels, QosClass, SharedOwner, TenantSelector, SHARED,
};
use gpumon_core::diagnose::{limitations, DiagnoseConfig, Diagnoser, Limitation, Sampling, Thresholds};
use gpumon_core::report::RunReport;
use gpumon_core::stages::{
    no_rows, AnyOutput, Event, EventField, EventRow, EventValue, Rows, Service, ServiceError, Services, StageOutput,
    StageOutputs,
};
use gpumon_core::steps::{StepTracker, Steps};
use gpumon_core::{
    DerivedPoint, Descriptor, Diagnosis, Family, Finding, FindingCount, FindingEvent, FindingKind, LabelValue,
    MetricId, MetricSet, PerDescriptor, Point, Processor, ProcessorContext, Severity, Transition, Unit, Value,
};

#[test]
fn the_stages_are_the_same_modules_at_the_root_and_under_stages() {
    // One type, two paths: a value of one is a value of the other.
    let steps: Option<gpumon_core::stages::steps::Steps> = None::<gpumon_core::steps::Steps>;
    let diagnoser: Option<gpumon_core::stages::diagnose::Diagnoser> = None::<gpumon_core::diagnose::Diagnoser>;
    let owner: gpumon_core::stages::attribution::Owner = gpumon_core::attribution::Owner::default();
    assert!(steps.is_none() && diagnoser.is_none() && owner.is_unknown());
    assert_eq!(gpumon_core::attribution::SHARED, gpumon_core::stages::attribution::SHARED);
}
