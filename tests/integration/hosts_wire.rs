//! The published `roz.v1.HostService` contract (hosts.proto): names,
//! numbers, types and method signatures checked against the compiled
//! descriptor, and a `Host` decoded from hand-built protobuf bytes, so a
//! rename, renumbering or retyping in `proto/roz/v1/hosts.proto` fails here.

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use rozd::api::proto;

use crate::common::wire::{ld, varint};

#[test]
fn host_fields_1_to_7() {
    let entry = [ld(1, b"sensors"), ld(2, b"t,rh")].concat();
    let created = varint(1, 1_700_000_000);
    let heartbeat = [varint(1, 1_700_000_010), varint(2, 5)].concat();
    let bytes = [
        ld(1, b"rover-1"),
        ld(2, b"Rover 1"),
        ld(3, b"lab"),
        ld(4, b"online"),
        ld(5, &entry),
        ld(6, &created),
        ld(7, &heartbeat),
    ]
    .concat();
    let host = proto::Host::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        (
            host.id.as_str(),
            host.name.as_str(),
            host.environment_id.as_str(),
            host.status.as_str()
        ),
        ("rover-1", "Rover 1", "lab", "online")
    );
    assert_eq!(host.capabilities["sensors"], "t,rh");
    assert_eq!(host.created_at.unwrap().seconds, 1_700_000_000);
    let hb = host.last_heartbeat.unwrap();
    assert_eq!((hb.seconds, hb.nanos), (1_700_000_010, 5));
}

#[test]
fn requests() {
    let r = proto::ListHostsRequest::decode(
        [ld(1, b"lab"), varint(2, 10), varint(3, 20)]
            .concat()
            .as_slice(),
    )
    .unwrap();
    assert_eq!(
        (r.environment_id.as_str(), r.limit, r.offset),
        ("lab", 10, 20)
    );
    let entry = [ld(1, b"k"), ld(2, b"v")].concat();
    let r = proto::RegisterHostRequest::decode(
        [ld(1, b"camera"), ld(2, b"lab"), ld(3, &entry)]
            .concat()
            .as_slice(),
    )
    .unwrap();
    assert_eq!(
        (r.name.as_str(), r.environment_id.as_str()),
        ("camera", "lab")
    );
    assert_eq!(r.capabilities["k"], "v");
    assert_eq!(
        proto::GetHostRequest::decode(ld(1, b"x").as_slice())
            .unwrap()
            .id,
        "x"
    );
    assert_eq!(
        proto::DeregisterHostRequest::decode(ld(1, b"x").as_slice())
            .unwrap()
            .id,
        "x"
    );
    assert!(
        proto::DeregisterHostResponse::default()
            .encode_to_vec()
            .is_empty()
    );
    let list = proto::ListHostsResponse::decode(ld(1, &ld(1, b"a")).as_slice()).unwrap();
    assert_eq!(list.data[0].id, "a");
}

type Field<'a> = (&'a str, i32, (Type, Label), &'a str);

#[test]
fn descriptor_matches_the_published_contract() {
    let set = prost_types::FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET).unwrap();
    let file = set
        .file
        .into_iter()
        .find(|f| f.name() == "roz/v1/hosts.proto")
        .expect("hosts.proto is compiled into the descriptor set");
    assert_eq!(file.package(), "roz.v1");
    assert_eq!(file.syntax(), "proto3");
    let service = file
        .service
        .iter()
        .find(|s| s.name() == "HostService")
        .expect("service HostService");
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
                "RegisterHost",
                ".roz.v1.RegisterHostRequest",
                ".roz.v1.Host",
                false,
                false
            ),
            (
                "GetHost",
                ".roz.v1.GetHostRequest",
                ".roz.v1.Host",
                false,
                false
            ),
            (
                "ListHosts",
                ".roz.v1.ListHostsRequest",
                ".roz.v1.ListHostsResponse",
                false,
                false
            ),
            (
                "DeregisterHost",
                ".roz.v1.DeregisterHostRequest",
                ".roz.v1.DeregisterHostResponse",
                false,
                false
            ),
        ]
    );
    let string = (Type::String, Label::Optional);
    let int64 = (Type::Int64, Label::Optional);
    let map = (Type::Message, Label::Repeated);
    let message = (Type::Message, Label::Optional);
    let expected: &[(&str, &[Field<'static>])] = &[
        (
            "RegisterHostRequest",
            &[
                ("name", 1, string, ""),
                ("environment_id", 2, string, ""),
                (
                    "capabilities",
                    3,
                    map,
                    ".roz.v1.RegisterHostRequest.CapabilitiesEntry",
                ),
            ],
        ),
        ("GetHostRequest", &[("id", 1, string, "")]),
        ("DeregisterHostRequest", &[("id", 1, string, "")]),
        ("DeregisterHostResponse", &[]),
        (
            "ListHostsRequest",
            &[
                ("environment_id", 1, string, ""),
                ("limit", 2, int64, ""),
                ("offset", 3, int64, ""),
            ],
        ),
        (
            "ListHostsResponse",
            &[("data", 1, (Type::Message, Label::Repeated), ".roz.v1.Host")],
        ),
        (
            "Host",
            &[
                ("id", 1, string, ""),
                ("name", 2, string, ""),
                ("environment_id", 3, string, ""),
                ("status", 4, string, ""),
                ("capabilities", 5, map, ".roz.v1.Host.CapabilitiesEntry"),
                ("created_at", 6, message, ".google.protobuf.Timestamp"),
                ("last_heartbeat", 7, message, ".google.protobuf.Timestamp"),
            ],
        ),
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
                assert!(f.oneof_index.is_none(), "{name}.{} must be plain", f.name());
                (f.name(), f.number(), (f.r#type(), f.label()), f.type_name())
            })
            .collect();
        assert_eq!(got, *fields, "message {name}");
    }
}

#[test]
fn full_method_paths() {
    use proto::host_service_server::HostServiceServer;
    use tonic::server::NamedService;
    assert_eq!(
        <HostServiceServer<NoHosts> as NamedService>::NAME,
        "roz.v1.HostService"
    );
}

/// Only to name the generated server type.
struct NoHosts;

#[tonic::async_trait]
impl proto::host_service_server::HostService for NoHosts {
    async fn register_host(
        &self,
        _: tonic::Request<proto::RegisterHostRequest>,
    ) -> Result<tonic::Response<proto::Host>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn get_host(
        &self,
        _: tonic::Request<proto::GetHostRequest>,
    ) -> Result<tonic::Response<proto::Host>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn list_hosts(
        &self,
        _: tonic::Request<proto::ListHostsRequest>,
    ) -> Result<tonic::Response<proto::ListHostsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn deregister_host(
        &self,
        _: tonic::Request<proto::DeregisterHostRequest>,
    ) -> Result<tonic::Response<proto::DeregisterHostResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
}
