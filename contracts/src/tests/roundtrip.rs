//! `parse(render(x)) == x` for every contract type, over randomly built
//! values (proptest supplies the seed, `fields::sample` builds the value).

use proptest::prelude::*;

use crate::component::{ComponentContext, ComponentSkillHandoff, ParityStatus};
use crate::contract::Contract;
use crate::conversion::{ConversionHandoff, ConversionRequest, ConversionRetryRequest};
use crate::escape_hatch::EscapeHatch;
use crate::fields::sample::{Gen, Sample};
use crate::final_handoff::FinalHandoff;
use crate::pipeline::{PipelineContext, PipelineHandoff};
use crate::prep::PrepHandoff;

fn round_trip<T: Contract + Sample + PartialEq + std::fmt::Debug>(seed: u64) {
    let value = T::sample(&mut Gen::new(seed));
    let text = value.render();
    match T::parse(&text) {
        Ok(back) => assert_eq!(back, value, "rendered:\n{text}"),
        Err(e) => panic!("{e}: {:#?}\nrendered:\n{text}", e.findings()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn prep_handoff(seed: u64) { round_trip::<PrepHandoff>(seed) }
    #[test]
    fn escape_hatch(seed: u64) { round_trip::<EscapeHatch>(seed) }
    #[test]
    fn component_context(seed: u64) { round_trip::<ComponentContext>(seed) }
    #[test]
    fn parity_status(seed: u64) { round_trip::<ParityStatus>(seed) }
    #[test]
    fn conversion_request(seed: u64) { round_trip::<ConversionRequest>(seed) }
    #[test]
    fn conversion_retry_request(seed: u64) { round_trip::<ConversionRetryRequest>(seed) }
    #[test]
    fn conversion_handoff(seed: u64) { round_trip::<ConversionHandoff>(seed) }
    #[test]
    fn component_skill_handoff(seed: u64) { round_trip::<ComponentSkillHandoff>(seed) }
    #[test]
    fn pipeline_context(seed: u64) { round_trip::<PipelineContext>(seed) }
    #[test]
    fn pipeline_handoff(seed: u64) { round_trip::<PipelineHandoff>(seed) }
    #[test]
    fn final_handoff(seed: u64) { round_trip::<FinalHandoff>(seed) }
}

#[test]
fn examples_round_trip_through_render() {
    use super::examples::*;
    fn again<T: Contract + PartialEq + std::fmt::Debug>(text: &str) {
        let v = T::parse(text).unwrap();
        assert_eq!(T::parse(&v.render()).unwrap(), v);
        // rendering is canonical: a second render is byte-identical
        assert_eq!(T::parse(&v.render()).unwrap().render(), v.render());
    }
    again::<PrepHandoff>(PREP);
    again::<EscapeHatch>(ESCAPE_NESTED);
    again::<ComponentContext>(COMPONENT_CONTEXT);
    again::<ParityStatus>(PARITY_STATUS);
    again::<ConversionRequest>(CONVERSION_REQUEST);
    again::<ConversionRetryRequest>(RETRY);
    again::<ConversionHandoff>(CONVERSION_HANDOFF);
    again::<ComponentSkillHandoff>(SKILL_HANDOFF);
    again::<PipelineContext>(PIPELINE_CONTEXT);
    again::<PipelineHandoff>(PIPELINE_HANDOFF);
    again::<FinalHandoff>(FINAL);
}
