//! The `foo_client` module: `FooClient` with an async and a blocking method per RPC.

use proc_macro2::TokenStream;
use quote::quote;

use crate::generator::{doc_attrs, doc_attrs_or, MethodKind, MethodModel, ServiceModel};

/// The client module of `service`.
pub(crate) fn generate(service: &ServiceModel) -> TokenStream {
    let ServiceModel {
        full_name,
        core,
        client_mod,
        client_ident,
        ..
    } = service;
    let mod_docs = doc_attrs(
        &format!("Generated client for `{full_name}`."),
        &service.docs,
    );
    let struct_docs = doc_attrs(
        &format!(
            "Client for `{full_name}`: one async and one blocking method per RPC. \
             Cheap to clone; every clone shares the channel. Async methods call over any \
             `CallService` (unary) or `StreamService` (streaming): a channel, or tower \
             layers over one; blocking streaming methods over a `Channel`."
        ),
        &[],
    );
    let methods: Vec<_> = service
        .methods
        .iter()
        .map(|method| (method.kind, generate_method(service, method)))
        .collect();
    let of = |unary: bool| {
        methods
            .iter()
            .filter(move |(kind, _)| (*kind == MethodKind::Unary) == unary)
            .map(|(_, generated)| generated)
    };
    let unary = of(true).map(|m| {
        let (call, blocking) = (&m.call, &m.blocking);
        quote!(#call #blocking)
    });
    let streaming_calls: Vec<_> = of(false).map(|m| &m.call).collect();
    let streaming_impl = (!streaming_calls.is_empty()).then(|| {
        quote! {
            impl<S: #core::StreamService> #client_ident<S> {
                #(#streaming_calls)*
            }
        }
    });
    let streaming_blocking = of(false).map(|m| &m.blocking);

    quote! {
        #mod_docs
        pub mod #client_mod {
            #struct_docs
            #[derive(Debug, Clone)]
            pub struct #client_ident<S = #core::Channel> {
                service: S,
            }

            impl<S> #client_ident<S> {
                /// A client that calls over `service`: a `Channel`, or tower layers over
                /// one (any `CallService`).
                #[must_use]
                pub const fn new(service: S) -> Self {
                    Self { service }
                }

                /// The service the client calls over.
                #[must_use]
                pub const fn get_ref(&self) -> &S {
                    &self.service
                }

                /// The service the client calls over.
                #[must_use]
                pub fn into_inner(self) -> S {
                    self.service
                }
            }

            impl #client_ident<#core::Channel> {
                /// A client that calls over `channel`, every call first passing
                /// `interceptor` (which may add metadata or refuse the call).
                #[must_use]
                pub fn with_interceptor(
                    channel: #core::Channel,
                    interceptor: impl #core::Interceptor,
                ) -> Self {
                    Self::new(channel.with_interceptor(interceptor))
                }

                /// The channel the client calls over.
                #[must_use]
                pub const fn channel(&self) -> &#core::Channel {
                    &self.service
                }

                #(#streaming_blocking)*
            }

            impl<S: #core::CallService> #client_ident<S> {
                #(#unary)*
            }

            #streaming_impl
        }
    }
}

/// A method's async form, and its blocking form (empty where there is none).
struct Generated {
    call: TokenStream,
    blocking: TokenStream,
}

fn generate_method(service: &ServiceModel, method: &MethodModel) -> Generated {
    let ServiceModel {
        core, client_ident, ..
    } = service;
    let MethodModel {
        path,
        fn_ident,
        blocking_ident,
        input,
        output,
        ..
    } = method;
    let docs = doc_attrs_or(&format!("Calls `{path}`."), &method.docs);
    // Intra-doc links cannot name raw identifiers (`r#type`): those get plain code spans.
    let fn_name = fn_ident.to_string();
    let target = if fn_name.starts_with("r#") {
        format!("`{client_ident}::{fn_name}`")
    } else {
        format!("[`{client_ident}::{fn_name}`]")
    };
    let blocking_docs = doc_attrs(
        &format!("Blocking form of {target}: waits on the calling thread."),
        &[
            " # Errors".to_owned(),
            String::new(),
            " The handler's status, or the channel's (`Unavailable`, `DeadlineExceeded`, ...)."
                .to_owned(),
        ],
    );

    // What the method's static says of it: its path, and which sides stream.
    let method_init = match method.kind {
        MethodKind::Unary => quote!(#core::Method::new(#path)),
        MethodKind::ServerStreaming => {
            quote!(#core::Method::of_kind(#path, #core::MethodKind::ServerStreaming))
        }
        MethodKind::ClientStreaming => {
            quote!(#core::Method::of_kind(#path, #core::MethodKind::ClientStreaming))
        }
        MethodKind::Bidi => quote!(#core::Method::of_kind(#path, #core::MethodKind::Streaming)),
    };
    // A named request type instead of `impl IntoRequest`, so that `use<R>` can keep the
    // future from capturing `&self` (Rust 2024 capture rules): it outlives the client.
    let async_fn =
        |call: TokenStream, captures: TokenStream, request: TokenStream, out: TokenStream| {
            quote! {
                #docs
                pub fn #fn_ident<R: #request>(
                    &self,
                    request: R,
                ) -> impl ::core::future::Future<
                    Output = ::core::result::Result<#core::Response<#out>, #core::Status>,
                > + ::core::marker::Send + 'static + use<#captures> {
                    static METHOD: #core::Method = #method_init;
                    #call
                }
            }
        };
    let single = quote!(#core::IntoRequest<#input>);
    let into_single = quote!(#core::IntoRequest::<#input>::into_request(request));
    let many = quote!(#core::IntoStreamingRequest<Message = #input>);
    let into_many = quote!(#core::IntoStreamingRequest::into_streaming_request(request));
    let streaming_out = quote!(#core::Streaming<#output>);
    let stream_service = quote!(#core::client::stream_service);
    match method.kind {
        MethodKind::Unary => {
            let call = async_fn(
                quote!(#core::client::service::unary(&self.service, &METHOD, #into_single)),
                quote!(R, S),
                single,
                quote!(#output),
            );
            let blocking = quote! {
                #blocking_docs
                pub fn #blocking_ident(
                    &self,
                    request: impl #core::IntoRequest<#input>,
                ) -> ::core::result::Result<#core::Response<#output>, #core::Status> {
                    static METHOD: #core::Method = #method_init;
                    #core::client::service::unary_blocking(
                        &self.service,
                        &METHOD,
                        #core::IntoRequest::<#input>::into_request(request),
                    )
                }
            };
            Generated { call, blocking }
        }
        MethodKind::ServerStreaming => {
            let call = async_fn(
                quote!(#stream_service::server_streaming(&self.service, &METHOD, #into_single)),
                quote!(R, S),
                single,
                streaming_out,
            );
            let blocking = quote! {
                #blocking_docs
                pub fn #blocking_ident(
                    &self,
                    request: impl #core::IntoRequest<#input>,
                ) -> ::core::result::Result<
                    #core::Response<#core::stream::BlockingStreaming<#output>>,
                    #core::Status,
                > {
                    static METHOD: #core::Method = #method_init;
                    self.service.server_streaming_blocking(
                        &METHOD,
                        #core::IntoRequest::<#input>::into_request(request),
                    )
                }
            };
            Generated { call, blocking }
        }
        MethodKind::ClientStreaming => {
            let call = async_fn(
                quote!(#stream_service::client_streaming(&self.service, &METHOD, #into_many)),
                quote!(R, S),
                many,
                quote!(#output),
            );
            let blocking = quote! {
                #blocking_docs
                pub fn #blocking_ident<I: ::core::iter::IntoIterator<Item = #input>>(
                    &self,
                    request: impl #core::IntoRequest<I>,
                ) -> ::core::result::Result<#core::Response<#output>, #core::Status> {
                    static METHOD: #core::Method = #method_init;
                    self.service.client_streaming_blocking(
                        &METHOD,
                        #core::IntoRequest::<I>::into_request(request),
                    )
                }
            };
            Generated { call, blocking }
        }
        // No blocking form: one thread cannot both wait for responses and produce requests.
        MethodKind::Bidi => Generated {
            call: async_fn(
                quote!(#stream_service::streaming(&self.service, &METHOD, #into_many)),
                quote!(R, S),
                many,
                streaming_out,
            ),
            blocking: TokenStream::new(),
        },
    }
}
