//! The built-in stages' outputs read back from a snapshot's JSON, by key (`"diagnosis"`,
//! `"steps"`, `"attribution"`); an embedder's outputs are written but not read back (nothing
//! knows their types), and unknown keys are skipped.
//!
//! Here, not next to `StageOutputs` in the model: this is the one place that names every
//! built-in stage, so the model (and the stage framework in `stages/mod.rs`) depend on none.

use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::{attribution, diagnose, steps};
use crate::model::StageOutputs;

impl<'de> Deserialize<'de> for StageOutputs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Outputs;
        impl<'de> Visitor<'de> for Outputs {
            type Value = StageOutputs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("stage outputs")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StageOutputs, A::Error> {
                let mut outputs = StageOutputs::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        diagnose::finding::DIAGNOSIS_KEY => {
                            outputs.insert(Arc::new(map.next_value::<diagnose::finding::Diagnosis>()?));
                        }
                        steps::STEPS_KEY => {
                            outputs.insert(Arc::new(map.next_value::<steps::Steps>()?));
                        }
                        attribution::ATTRIBUTION_KEY => {
                            outputs.insert(Arc::new(map.next_value::<attribution::AttributionSummary>()?));
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(outputs)
            }
        }
        deserializer.deserialize_map(Outputs)
    }
}
