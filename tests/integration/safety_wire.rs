//! The published `roz.v1.SafetyService` contract (safety.proto): field
//! numbers checked against hand-built protobuf bytes, and names, numbers,
//! types and method signatures checked against the compiled descriptor, so a
//! rename, renumbering or retyping in `proto/roz/v1/safety.proto` fails here.

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use rozd::api::proto;

use crate::common::wire::{ld, varint};

#[test]
fn get_safety_status_request_field_1_is_environment_id() {
    let bytes = ld(1, b"lab");
    let decoded = proto::GetSafetyStatusRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.environment_id, "lab");
    assert_eq!(decoded.encode_to_vec(), bytes);
}

#[test]
fn safety_status_fields_1_to_4() {
    let bytes = [
        ld(1, b"lab"),
        varint(2, 1),
        ld(3, b"protective_stop"),
        ld(4, b"protective_stop:rest"),
        ld(4, b"stop_input:gpio:17"),
    ]
    .concat();
    let decoded = proto::SafetyStatus::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        decoded,
        proto::SafetyStatus {
            environment_id: "lab".into(),
            estop_active: true,
            level: "protective_stop".into(),
            active_guards: vec!["protective_stop:rest".into(), "stop_input:gpio:17".into()],
        }
    );
    assert_eq!(decoded.encode_to_vec(), bytes);
}

#[test]
fn trigger_and_clear_requests_are_environment_1_and_reason_2() {
    let bytes = [ld(1, b"lab"), ld(2, b"operator pressed stop")].concat();
    let trigger = proto::TriggerEstopRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        (trigger.environment_id.as_str(), trigger.reason.as_str()),
        ("lab", "operator pressed stop")
    );
    assert_eq!(trigger.encode_to_vec(), bytes);
    let clear = proto::ClearEstopRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        (clear.environment_id.as_str(), clear.reason.as_str()),
        ("lab", "operator pressed stop")
    );
    assert_eq!(clear.encode_to_vec(), bytes);
}

#[test]
fn responses_are_empty_messages() {
    assert!(
        proto::TriggerEstopResponse::default()
            .encode_to_vec()
            .is_empty()
    );
    assert!(
        proto::ClearEstopResponse::default()
            .encode_to_vec()
            .is_empty()
    );
    // Unknown fields from a newer peer are skipped, not errors.
    let future = ld(9, b"x");
    proto::TriggerEstopResponse::decode(future.as_slice()).unwrap();
    proto::ClearEstopResponse::decode(future.as_slice()).unwrap();
}

/// A field's name, number, type and label.
type Field<'a> = (&'a str, i32, (Type, Label));

fn safety_file() -> prost_types::FileDescriptorProto {
    let set = prost_types::FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET).unwrap();
    set.file
        .into_iter()
        .find(|f| f.name() == "roz/v1/safety.proto")
        .expect("safety.proto is compiled into the descriptor set")
}

#[test]
fn descriptor_matches_the_published_contract() {
    let file = safety_file();
    assert_eq!(file.package(), "roz.v1");
    assert_eq!(file.syntax(), "proto3");

    let service = file
        .service
        .iter()
        .find(|s| s.name() == "SafetyService")
        .expect("service SafetyService");
    let methods: Vec<(&str, &str, &str, bool, bool)> = service
        .method
        .iter()
        .map(|m| {
            (
                m.name(),
                m.input_type(),
                m.output_type(),
                m.client_streaming(),
                m.server_streaming(),
            )
        })
        .collect();
    assert_eq!(
        methods,
        [
            (
                "GetSafetyStatus",
                ".roz.v1.GetSafetyStatusRequest",
                ".roz.v1.SafetyStatus",
                false,
                false
            ),
            (
                "TriggerEstop",
                ".roz.v1.TriggerEstopRequest",
                ".roz.v1.TriggerEstopResponse",
                false,
                false
            ),
            (
                "ClearEstop",
                ".roz.v1.ClearEstopRequest",
                ".roz.v1.ClearEstopResponse",
                false,
                false
            ),
        ]
    );

    let string = (Type::String, Label::Optional);
    let expected: &[(&str, &[Field<'static>])] = &[
        ("GetSafetyStatusRequest", &[("environment_id", 1, string)]),
        (
            "SafetyStatus",
            &[
                ("environment_id", 1, string),
                ("estop_active", 2, (Type::Bool, Label::Optional)),
                ("level", 3, string),
                ("active_guards", 4, (Type::String, Label::Repeated)),
            ],
        ),
        (
            "TriggerEstopRequest",
            &[("environment_id", 1, string), ("reason", 2, string)],
        ),
        ("TriggerEstopResponse", &[]),
        (
            "ClearEstopRequest",
            &[("environment_id", 1, string), ("reason", 2, string)],
        ),
        ("ClearEstopResponse", &[]),
    ];
    assert_eq!(file.message_type.len(), expected.len());
    for (name, fields) in expected {
        let message = file
            .message_type
            .iter()
            .find(|m| m.name() == *name)
            .unwrap_or_else(|| panic!("message {name}"));
        let got: Vec<Field<'_>> = message
            .field
            .iter()
            .map(|f| {
                // proto3 `optional` (explicit presence) would show up as a synthetic oneof.
                assert!(f.oneof_index.is_none(), "{name}.{} must be plain", f.name());
                (f.name(), f.number(), (f.r#type(), f.label()))
            })
            .collect();
        assert_eq!(got, *fields, "message {name}");
    }
}

#[test]
fn full_method_paths() {
    use proto::safety_service_server::SafetyServiceServer;
    use tonic::server::NamedService;
    assert_eq!(
        <SafetyServiceServer<NoSafety> as NamedService>::NAME,
        "roz.v1.SafetyService"
    );
}

/// Only to name the generated server type.
struct NoSafety;

#[tonic::async_trait]
impl proto::safety_service_server::SafetyService for NoSafety {
    async fn get_safety_status(
        &self,
        _: tonic::Request<proto::GetSafetyStatusRequest>,
    ) -> Result<tonic::Response<proto::SafetyStatus>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn trigger_estop(
        &self,
        _: tonic::Request<proto::TriggerEstopRequest>,
    ) -> Result<tonic::Response<proto::TriggerEstopResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn clear_estop(
        &self,
        _: tonic::Request<proto::ClearEstopRequest>,
    ) -> Result<tonic::Response<proto::ClearEstopResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
}
