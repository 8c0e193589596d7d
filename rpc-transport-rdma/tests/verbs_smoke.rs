//! Opens the RDMA device and exercises the objects that need no peer: query device and port,
//! PD, MRs over owned and borrowed memory, completion channel and CQ.
//! Prints "skipped" without a device (fails instead with RDMA_RPC_REQUIRE_DEVICE=1).

mod common;

use rpc_transport_rdma::verbs::{
    devices, test_support, AccessFlags, CompletionChannel, CompletionQueue, Context, MemoryRegion,
    PortState, ProtectionDomain, VerbsError, WorkCompletion,
};

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn open_query_allocate_register() {
    let Some(device) = test_support::require_device() else {
        return;
    };
    assert!(devices()
        .expect("devices")
        .iter()
        .any(|d| d.name == device.name));

    let ctx = Context::open(&device.name).expect("ibv_open_device");
    assert_eq!(ctx.name(), device.name);
    let attr = ctx.query_device().expect("ibv_query_device");
    eprintln!("{}: {attr:?}", device.name);
    assert!(attr.phys_port_cnt >= 1);
    assert!(attr.max_qp > 0 && attr.max_qp_wr > 0 && attr.max_cqe > 0 && attr.max_mr_size > 0);

    let port = ctx.query_port(1).expect("ibv_query_port");
    eprintln!("port 1: {port:?}");
    assert_eq!(port.state, PortState::Active);
    assert!(port.active_mtu >= 256);
    ctx.query_gid(1, 0).expect("ibv_query_gid");

    let pd = ProtectionDomain::new(&ctx).expect("ibv_alloc_pd");

    // An owned, page-aligned registration.
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut mr = MemoryRegion::alloc(&pd, 3 * 4096 + 100, access).expect("ibv_reg_mr");
    assert_eq!(mr.addr() % 4096, 0);
    assert_eq!(mr.len(), 3 * 4096 + 100);
    // The device or a peer may write it: safe code gets no slice of it.
    assert!(mr.device_writable());
    assert!(mr.as_slice().is_none() && mr.as_mut_slice().is_none());
    // SAFETY: no work request names the region and its rkey was given to nobody.
    assert!(unsafe { mr.slice_unchecked() }.iter().all(|&b| b == 0));
    // SAFETY: as above.
    let bytes = unsafe { mr.slice_mut_unchecked() };
    bytes[..4].copy_from_slice(b"rdma");
    let sge = mr.sge(0..4).expect("sge in bounds");
    assert_eq!(
        (sge.addr(), sge.length(), sge.lkey()),
        (mr.addr(), 4, mr.lkey())
    );
    assert!(
        mr.sge(0..mr.len() + 1).is_err(),
        "out-of-bounds SGE must be refused"
    );
    assert_eq!(mr.remote_addr().rkey, mr.rkey());

    // Caller memory, borrowed for the registration's lifetime.
    let mut buf = vec![7u8; 1000];
    {
        let access = AccessFlags::LOCAL_WRITE;
        // SAFETY: the region is dropped at the end of this block, before `buf` is used
        // again, and no work request names it.
        let borrowed = unsafe { MemoryRegion::register_borrowed(&pd, &mut buf, access) };
        let borrowed = borrowed.expect("ibv_reg_mr");
        assert!(
            borrowed.as_slice().is_none(),
            "LOCAL_WRITE: the device may write it"
        );
        // SAFETY: no work request names the region.
        assert_eq!(unsafe { borrowed.slice_unchecked() }[999], 7);
    }
    buf[0] = 1;

    // A Vec handed over to the region.
    let mut vec_mr =
        MemoryRegion::register(&pd, vec![0u8; 512], AccessFlags::NONE).expect("ibv_reg_mr");
    assert_eq!(vec_mr.len(), 512);
    // Only this process writes a region registered without LOCAL_WRITE: safe slices.
    assert!(!vec_mr.device_writable());
    vec_mr.as_mut_slice().expect("read-only to the device")[0] = 9;
    assert_eq!(vec_mr.as_slice().map(|s| s[0]), Some(9));

    // Invalid requests are refused before reaching the device.
    match MemoryRegion::register(&pd, vec![0u8; 16], AccessFlags::REMOTE_WRITE) {
        Err(VerbsError::InvalidArgument { .. }) => {}
        other => panic!("REMOTE_WRITE without LOCAL_WRITE: {other:?}"),
    }
    assert!(MemoryRegion::register(&pd, Vec::new(), AccessFlags::NONE).is_err());

    // Completion channel and CQ.
    let channel = CompletionChannel::new(&ctx).expect("ibv_create_comp_channel");
    let cq = CompletionQueue::new(&ctx, 16, Some(&channel), 42).expect("ibv_create_cq");
    assert!(cq.capacity() >= 16);
    let mut wcs = WorkCompletion::array(4);
    assert!(cq.poll(&mut wcs).expect("ibv_poll_cq").is_empty());
    cq.req_notify(false).expect("ibv_req_notify_cq");
    channel.set_nonblocking(true).expect("O_NONBLOCK");
    assert_eq!(channel.try_get_event().expect("no event pending"), None);
    let plain_cq = CompletionQueue::new(&ctx, 1, None, 0).expect("ibv_create_cq");
    assert!(
        plain_cq.req_notify(false).is_err(),
        "arming a CQ without channel"
    );

    // Parents dropped first: the children's Arcs keep them alive until the children go.
    drop(ctx);
    drop(pd);
    drop(channel);
    drop(cq);
    drop(mr);
    drop(vec_mr);
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn opening_an_unknown_device_fails_cleanly() {
    if test_support::require_device().is_none() {
        return;
    }
    match Context::open("no-such-device") {
        Err(VerbsError::NoDevice { name }) => assert_eq!(name.as_deref(), Some("no-such-device")),
        other => panic!("expected NoDevice, got {other:?}"),
    }
}
