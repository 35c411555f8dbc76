#define VMMW_ACCESS_NONE 0
#define VMMW_ACCESS_READ 1
#define VMMW_ACCESS_READWRITE 2
#define VMMW_BACKEND_AUTO 0
#define VMMW_BACKEND_CUDA 2
#define VMMW_BACKEND_HOST 1
#define VMMW_BUFFER_TOO_SMALL 16
#define VMMW_CANCELLED 13
#define VMMW_CHECKPOINT_INVALID 10
#define VMMW_COPY_AUTO 0
#define VMMW_COPY_DIRECT 1
#define VMMW_COPY_READ 3
#define VMMW_COPY_SIMPLE 4
#define VMMW_COPY_STAGED 2
#define VMMW_DRIVER_ERROR 6
#define VMMW_DRIVER_UNAVAILABLE 5
#define VMMW_HOST_OUT_OF_MEMORY 4
#define VMMW_INVALID_ARGUMENT 1
#define VMMW_INVALID_STATE 9
#define VMMW_IO 11
#define VMMW_LOAD_IN_PROGRESS 17
#define VMMW_MAX_DIMS 8
#define VMMW_METADATA_ARRAY 9
#define VMMW_METADATA_BOOL 7
#define VMMW_METADATA_FLOAT32 6
#define VMMW_METADATA_FLOAT64 12
#define VMMW_METADATA_INT16 3
#define VMMW_METADATA_INT32 5
#define VMMW_METADATA_INT64 11
#define VMMW_METADATA_INT8 1
#define VMMW_METADATA_STRING 8
#define VMMW_METADATA_UINT16 2
#define VMMW_METADATA_UINT32 4
#define VMMW_METADATA_UINT64 10
#define VMMW_METADATA_UINT8 0
#define VMMW_MULTI_RANKS 1
#define VMMW_MULTI_REPLICAS 0
#define VMMW_NULL_ARGUMENT 2
#define VMMW_OK 0
#define VMMW_OUT_OF_MEMORY 3
#define VMMW_PANIC 14
#define VMMW_PLAN_MISMATCH 12
#define VMMW_POLICY_DISCARD 1
#define VMMW_POLICY_OFFLOAD 0
#define VMMW_POLICY_OFFLOAD_COMPRESSED 3
#define VMMW_POLICY_RELOAD 2
#define VMMW_SHARE_REFUSED 18
#define VMMW_SHARE_REVOKED 19
#define VMMW_SHARE_SLEEP_REFUSE 0
#define VMMW_SHARE_SLEEP_REVOKE 1
#define VMMW_STAGING_ALWAYS 1
#define VMMW_STAGING_AUTO 0
#define VMMW_TAG_DEFAULT 0
#define VMMW_UNKNOWN_POINTER 7
#define VMMW_UNKNOWN_TAG 8
#define VMMW_UNSUPPORTED 15
#define VMMW_UPDATE_DEVICE 0
#define VMMW_UPDATE_HOST 1
#define VMMW_UPDATE_SOURCE 21
#define VMMW_UPDATE_TORN 22
const char*vmmw_error_message(const struct vmmw_error_t*error);
const char*vmmw_status_name(vmmw_status_t status);
const char*vmmw_version_string(void);
int32_t vmmw_error_driver_code(const struct vmmw_error_t*error);
typedef int32_t vmmw_access_t;
typedef int32_t vmmw_backend_t;
typedef int32_t vmmw_copy_strategy_t;
typedef int32_t vmmw_multi_mode_t;
typedef int32_t vmmw_policy_t;
typedef int32_t vmmw_share_sleep_policy_t;
typedef int32_t vmmw_staging_t;
typedef int32_t vmmw_status_t;
typedef int32_t vmmw_update_memory_t;
typedef int32_t(*vmmw_progress_fn)(uint64_t done,uint64_t total,void*user);
typedef struct vmmw_broadcast_load_result_t{struct vmmw_update_result_t update;uint64_t buckets;uint64_t bytes;uint64_t files_read;uint64_t bytes_read;}vmmw_broadcast_load_result_t;
typedef struct vmmw_control_result_t{double seconds;double sync_seconds;double wait_seconds;uint64_t bytes;uint64_t backup_bytes;}vmmw_control_result_t;
typedef struct vmmw_control_server_t vmmw_control_server_t;
typedef struct vmmw_destination_t{uint64_t ptr;uint64_t bytes;char dtype[16];uint32_t ndim;uint64_t shape[VMMW_MAX_DIMS];}vmmw_destination_t;
typedef struct vmmw_device_t vmmw_device_t;
typedef struct vmmw_error_t vmmw_error_t;
typedef struct vmmw_load_options_t{size_t size;uint32_t allow_missing;uint32_t allow_unexpected;vmmw_copy_strategy_t strategy;uint32_t threads;uint64_t window_bytes;uint64_t slot_bytes;}vmmw_load_options_t;
typedef struct vmmw_load_result_t{uint64_t bytes;double seconds;double gbps;uint64_t direct_bytes;uint64_t staged_bytes;uint64_t read_bytes;uint64_t filled_bytes;uint32_t threads;}vmmw_load_result_t;
typedef struct vmmw_loader_t vmmw_loader_t;
typedef struct vmmw_metadata_t vmmw_metadata_t;
typedef struct vmmw_multi_result_t{uint64_t host_bytes;uint64_t peer_bytes;uint64_t delivered_bytes;double seconds;double host_seconds;double peer_seconds;double gbps;uint32_t recovered_devices;}vmmw_multi_result_t;
typedef struct vmmw_nccl_comm_t vmmw_nccl_comm_t;
typedef struct vmmw_pack_options_t{size_t size;uint64_t frame_bytes;uint32_t threads;uint32_t cpu;uint32_t force;int32_t device;}vmmw_pack_options_t;
typedef struct vmmw_pack_report_t{uint64_t original_bytes;uint64_t packed_bytes;uint64_t files;uint64_t tensors;double seconds;double sync_seconds;}vmmw_pack_report_t;
typedef struct vmmw_peer_access_t{int32_t device;vmmw_access_t access;}vmmw_peer_access_t;
typedef struct vmmw_plan_summary_t{uint64_t extents;uint64_t fills;uint64_t src_bytes;uint64_t dst_bytes;uint64_t sources;uint64_t skipped;uint64_t missing;uint64_t unexpected;uint64_t destinations;}vmmw_plan_summary_t;
typedef struct vmmw_pool_options_t{size_t size;const struct vmmw_device_t*device_handle;vmmw_backend_t backend;int32_t device;uint64_t align;uint64_t small_request_max;uint64_t small_segment_bytes;uint64_t large_segment_bytes;uint64_t chunk_bytes;}vmmw_pool_options_t;
typedef struct vmmw_pool_t vmmw_pool_t;
typedef struct vmmw_receive_stats_t{uint32_t direct;uint32_t attached;uint32_t reused;uint64_t chunks;double setup_seconds;double seconds;uint64_t kept_imports;uint64_t kept_bytes;}vmmw_receive_stats_t;
typedef struct vmmw_replica_sleep_options_t{size_t size;vmmw_policy_t holder_policy;}vmmw_replica_sleep_options_t;
typedef struct vmmw_replica_sleep_result_t{uint64_t backup_bytes;uint64_t released_bytes;double seconds;}vmmw_replica_sleep_result_t;
typedef struct vmmw_replica_wake_options_t{size_t size;uint64_t copy_piece_bytes;int32_t no_peer_copies;}vmmw_replica_wake_options_t;
typedef struct vmmw_replica_wake_result_t{uint64_t host_bytes;uint64_t peer_bytes;uint64_t delivered_bytes;double seconds;double map_seconds;double host_seconds;double peer_seconds;double gbps;uint32_t direct_pairs;}vmmw_replica_wake_result_t;
typedef struct vmmw_report_t{uint64_t live_bytes;uint64_t live_blocks;uint64_t reserved_bytes;uint64_t tracked_bytes;uint64_t segments;uint64_t awake_bytes;uint64_t offloaded_bytes;uint64_t discarded_bytes;uint64_t reloadable_bytes;uint64_t host_backup_bytes;uint64_t device_used_bytes;uint64_t device_total_bytes;uint32_t asleep;uint32_t tags;}vmmw_report_t;
typedef struct vmmw_segment_info_t{uint64_t ptr;uint64_t reserved;uint64_t committed;uint64_t mapped;uint64_t chunks;}vmmw_segment_info_t;
typedef struct vmmw_segment_t vmmw_segment_t;
typedef struct vmmw_send_report_t{uint64_t version;uint64_t buckets;uint64_t bytes;double setup_seconds;double seconds;}vmmw_send_report_t;
typedef struct vmmw_share_options_t{size_t size;vmmw_share_sleep_policy_t sleep_policy;uint32_t allow_write;uint32_t use_allowed_uid;uint32_t allowed_uid;uint32_t use_allowed_gid;uint32_t allowed_gid;uint32_t max_connections;uint32_t handshake_timeout_ms;}vmmw_share_options_t;
typedef struct vmmw_share_server_t vmmw_share_server_t;
typedef struct vmmw_share_t vmmw_share_t;
typedef struct vmmw_sleep_options_t{size_t size;uint64_t copy_piece_bytes;uint32_t streams;uint32_t debug_fill;uint64_t wake_coalesce_bytes;uint64_t backup_slab_bytes;uint64_t host_memory_limit;uint32_t free_backup_after_wake;uint32_t release_pinned_after_wake;uint8_t debug_fill_byte;uint32_t codec_element_bytes;}vmmw_sleep_options_t;
typedef struct vmmw_swap_options_t{size_t size;uint64_t wait_memory_ms;}vmmw_swap_options_t;
typedef struct vmmw_swap_result_t{vmmw_status_t sleep_status;vmmw_status_t wake_status;uint64_t slept_tags;uint64_t woken_tags;uint64_t released_bytes;uint64_t mapped_bytes;uint64_t copied_out_bytes;uint64_t copied_in_bytes;double sleep_seconds;double wake_seconds;double seconds;}vmmw_swap_result_t;
typedef struct vmmw_tag_policy_t{uint32_t tag;vmmw_policy_t policy;}vmmw_tag_policy_t;
typedef struct vmmw_update_options_t{size_t size;uint64_t expected_version;uint32_t tag_set;uint32_t tag;uint32_t allow_missing;uint32_t allow_unexpected;vmmw_staging_t staging;}vmmw_update_options_t;
typedef struct vmmw_update_receiver_t vmmw_update_receiver_t;
typedef struct vmmw_update_result_t{uint32_t tag;uint32_t staged;uint32_t retried;uint64_t version;uint64_t bytes;uint64_t destinations;uint64_t copies;double seconds;double gbps;double plan_seconds;double issue_seconds;double wait_seconds;double bookkeeping_seconds;}vmmw_update_result_t;
typedef struct vmmw_update_sender_t vmmw_update_sender_t;
typedef struct vmmw_update_source_t vmmw_update_source_t;
typedef struct vmmw_wake_options_t{size_t size;uint64_t wait_memory_ms;}vmmw_wake_options_t;
typedef void(*vmmw_remap_fn)(void*user,uint32_t tag,uint64_t epoch);
uint32_t vmmw_version_major(void);
uint32_t vmmw_version_minor(void);
uint32_t vmmw_version_patch(void);
vmmw_status_t vmmw_control_serve(const char*socket,struct vmmw_control_server_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_control_sleep(const char*socket,vmmw_policy_t policy,const char*const*tags,size_t n_tags,struct vmmw_control_result_t*result,struct vmmw_error_t**error);
vmmw_status_t vmmw_control_status(const char*socket,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_control_wake(const char*socket,uint64_t wait_memory_ms,const char*const*tags,size_t n_tags,struct vmmw_control_result_t*result,struct vmmw_error_t**error);
vmmw_status_t vmmw_device_backend(const struct vmmw_device_t*device,vmmw_backend_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_device_choice_reason(const struct vmmw_device_t*device,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_device_describe(const struct vmmw_device_t*device,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_device_granularity(const struct vmmw_device_t*device,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_device_mem_info(const struct vmmw_device_t*device,uint64_t*free_bytes,uint64_t*total_bytes,struct vmmw_error_t**error);
vmmw_status_t vmmw_device_open(vmmw_backend_t backend,int32_t device,struct vmmw_device_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_device_synchronize(const struct vmmw_device_t*device,struct vmmw_error_t**error);
vmmw_status_t vmmw_error_status(const struct vmmw_error_t*error);
vmmw_status_t vmmw_ggml_type(const char*name,uint32_t*id,size_t*block,size_t*type_size,struct vmmw_error_t**error);
vmmw_status_t vmmw_load_broadcast(struct vmmw_nccl_comm_t*comm,struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,const uint32_t*readers,size_t n_readers,uint64_t slot_bytes,uint64_t timeout_ms,uint32_t stage,struct vmmw_broadcast_load_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_allocate(struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,uint32_t tag,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_cancel(struct vmmw_loader_t*loader,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_declare_foreign(struct vmmw_loader_t*loader,uint64_t ptr,uint64_t bytes,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_destination(const struct vmmw_loader_t*loader,const char*name,struct vmmw_destination_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_destination_count(const struct vmmw_loader_t*loader,size_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_destination_name(const struct vmmw_loader_t*loader,size_t index,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_load(struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,vmmw_progress_fn progress,void*user,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_load_devices(struct vmmw_loader_t*const*loaders,struct vmmw_pool_t*const*pools,size_t count,vmmw_multi_mode_t mode,struct vmmw_multi_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_open(const char*path,struct vmmw_loader_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_plan(const struct vmmw_loader_t*loader,struct vmmw_plan_summary_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_register(struct vmmw_loader_t*loader,const char*name,uint64_t ptr,const char*dtype,const uint64_t*shape,size_t ndim,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_result(const struct vmmw_loader_t*loader,struct vmmw_load_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_result_json(const struct vmmw_loader_t*loader,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_set_options(struct vmmw_loader_t*loader,const struct vmmw_load_options_t*options,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_set_reload_check(struct vmmw_loader_t*loader,uint32_t enable,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_set_rules_json(struct vmmw_loader_t*loader,const char*json,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_set_rules_preset(struct vmmw_loader_t*loader,const char*family,uint32_t tp_rank,uint32_t tp_world,uint32_t head_dim,struct vmmw_error_t**error);
vmmw_status_t vmmw_loader_wake_replicas(struct vmmw_loader_t*const*loaders,struct vmmw_pool_t*const*pools,size_t count,struct vmmw_multi_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_bool(const struct vmmw_metadata_t*meta,size_t index,const size_t*path,size_t depth,uint8_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_count(const struct vmmw_metadata_t*meta,size_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_f64(const struct vmmw_metadata_t*meta,size_t index,const size_t*path,size_t depth,double*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_find(const struct vmmw_metadata_t*meta,const char*key,size_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_i64(const struct vmmw_metadata_t*meta,size_t index,const size_t*path,size_t depth,int64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_key(const struct vmmw_metadata_t*meta,size_t index,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_open(const char*path,struct vmmw_metadata_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_string(const struct vmmw_metadata_t*meta,size_t index,const size_t*path,size_t depth,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_type(const struct vmmw_metadata_t*meta,size_t index,const size_t*path,size_t depth,uint32_t*type_out,uint32_t*elem_type,size_t*len,struct vmmw_error_t**error);
vmmw_status_t vmmw_metadata_u64(const struct vmmw_metadata_t*meta,size_t index,const size_t*path,size_t depth,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_nccl_comm_from_raw(void*comm,struct vmmw_nccl_comm_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_nccl_comm_new(struct vmmw_pool_t*pool,const uint8_t*id,uint32_t world,uint32_t rank,struct vmmw_nccl_comm_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_nccl_deregister(struct vmmw_nccl_comm_t*comm,void*handle,struct vmmw_error_t**error);
vmmw_status_t vmmw_nccl_register(struct vmmw_nccl_comm_t*comm,uint64_t ptr,uint64_t len,void**handle,struct vmmw_error_t**error);
vmmw_status_t vmmw_nccl_unique_id(uint8_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pack(const char*input,const char*output,const struct vmmw_pack_options_t*options,vmmw_progress_fn progress,void*user,struct vmmw_pack_report_t*report,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_alloc(struct vmmw_pool_t*pool,uint64_t size,uint64_t*out_ptr,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_alloc_tagged(struct vmmw_pool_t*pool,uint64_t size,uint32_t tag,uint64_t*out_ptr,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_backup_view(const struct vmmw_pool_t*pool,uint64_t ptr,size_t len,const void**host,uint32_t*tag,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_can_access_peer(const struct vmmw_pool_t*pool,int32_t peer,int32_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_clear_timeline(struct vmmw_pool_t*pool,uint64_t*cleared,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_dealloc(struct vmmw_pool_t*pool,uint64_t ptr,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_default(int32_t device,struct vmmw_pool_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_drop_backups(struct vmmw_pool_t*pool,const uint32_t*tags,size_t n,uint32_t unpin,uint64_t*released,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_forget_reload(struct vmmw_pool_t*pool,uint32_t tag,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_free_ptr(struct vmmw_pool_t*pool,uint64_t ptr,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_last_cycle_json(const struct vmmw_pool_t*pool,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_mark_written(struct vmmw_pool_t*pool,uint64_t ptr,uint64_t len,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_new(const struct vmmw_pool_options_t*options,struct vmmw_pool_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_peer_access_at(const struct vmmw_pool_t*pool,uint32_t tag,size_t index,struct vmmw_peer_access_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_peer_access_count(const struct vmmw_pool_t*pool,uint32_t tag,size_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_publish(struct vmmw_pool_t*pool,uint32_t tag,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_read(const struct vmmw_pool_t*pool,uint64_t src,void*dst,size_t len,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_read_backup(const struct vmmw_pool_t*pool,uint64_t ptr,void*dst,size_t len,uint32_t*tag,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_release_backup(struct vmmw_pool_t*pool,uint64_t*released,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_release_staging(struct vmmw_pool_t*pool,uint64_t*released,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_report(const struct vmmw_pool_t*pool,struct vmmw_report_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_report_json(const struct vmmw_pool_t*pool,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_report_tag(const struct vmmw_pool_t*pool,uint32_t tag,struct vmmw_report_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_reserve_backup(struct vmmw_pool_t*pool,uint64_t bytes,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_set_peer_access(struct vmmw_pool_t*pool,uint32_t tag,const struct vmmw_peer_access_t*peers,size_t count,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_set_sleep_options(struct vmmw_pool_t*pool,const struct vmmw_sleep_options_t*options,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_set_tag_arena(struct vmmw_pool_t*pool,uint32_t tag,uint64_t reserve_bytes,uint64_t grow_step,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_set_tag_rdma(struct vmmw_pool_t*pool,uint32_t tag,int32_t rdma,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_set_tag_segments(struct vmmw_pool_t*pool,uint32_t tag,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_sleep(struct vmmw_pool_t*pool,const struct vmmw_tag_policy_t*items,size_t n,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_snapshot(struct vmmw_pool_t*pool,const char*name,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_staging_bytes(const struct vmmw_pool_t*pool,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_swap(struct vmmw_pool_t*pool,const struct vmmw_tag_policy_t*sleep,size_t n_sleep,const uint32_t*wake,size_t n_wake,const struct vmmw_swap_options_t*options,struct vmmw_swap_result_t*result,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_tag_of(const struct vmmw_pool_t*pool,uint64_t ptr,uint32_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_tag_torn(const struct vmmw_pool_t*pool,uint32_t tag,int32_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_tag_version(const struct vmmw_pool_t*pool,uint32_t tag,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_timeline_json(const struct vmmw_pool_t*pool,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_trim(struct vmmw_pool_t*pool,uint64_t*released,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_wake(struct vmmw_pool_t*pool,const uint32_t*tags,size_t n,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_wake_with(struct vmmw_pool_t*pool,const uint32_t*tags,size_t n,const struct vmmw_wake_options_t*options,struct vmmw_error_t**error);
vmmw_status_t vmmw_pool_write(struct vmmw_pool_t*pool,uint64_t dst,const void*src,size_t len,struct vmmw_error_t**error);
vmmw_status_t vmmw_remap_callback_add(vmmw_remap_fn f,void*user,uint64_t*id,struct vmmw_error_t**error);
vmmw_status_t vmmw_remap_callback_remove(uint64_t id,struct vmmw_error_t**error);
vmmw_status_t vmmw_replicas_sleep(struct vmmw_pool_t*const*pools,const uint32_t*tags,size_t count,struct vmmw_replica_sleep_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_replicas_sleep_with(struct vmmw_pool_t*const*pools,const uint32_t*tags,size_t count,const struct vmmw_replica_sleep_options_t*options,struct vmmw_replica_sleep_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_replicas_wake(struct vmmw_pool_t*const*pools,const uint32_t*tags,size_t count,const struct vmmw_replica_wake_options_t*options,struct vmmw_replica_wake_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_replicas_wake_by_reload(struct vmmw_loader_t*const*loaders,struct vmmw_pool_t*const*pools,size_t count,struct vmmw_multi_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_replicas_wake_from_backup(struct vmmw_pool_t*const*pools,const uint32_t*tags,size_t count,const struct vmmw_replica_wake_options_t*options,struct vmmw_replica_wake_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_segment_info(const struct vmmw_segment_t*segment,struct vmmw_segment_info_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_segment_new(const struct vmmw_device_t*device,uint64_t size,uint64_t chunk_size,struct vmmw_segment_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_segment_read(const struct vmmw_segment_t*segment,uint64_t offset,void*dst,size_t len,struct vmmw_error_t**error);
vmmw_status_t vmmw_segment_write(struct vmmw_segment_t*segment,uint64_t offset,const void*src,size_t len,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_attach(const struct vmmw_device_t*device,const char*path,uint32_t read_write,struct vmmw_share_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_count(const struct vmmw_share_t*share,size_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_detach(struct vmmw_share_t*share,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_owner_connected(const struct vmmw_share_t*share,uint32_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_read(const struct vmmw_share_t*share,uint64_t src,void*dst,size_t len,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_serve(struct vmmw_pool_t*pool,uint32_t tag,const struct vmmw_loader_t*loader,const char*path,const struct vmmw_share_options_t*options,struct vmmw_share_server_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_server_attached(const struct vmmw_share_server_t*server,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_server_publish(struct vmmw_share_server_t*server,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_tensor(const struct vmmw_share_t*share,const char*name,struct vmmw_destination_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_tensor_name(const struct vmmw_share_t*share,size_t index,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_share_version(const struct vmmw_share_t*share,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_tag_current(uint32_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_tag_id(const char*name,uint32_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_tag_name(uint32_t tag,char*buf,size_t cap,size_t*needed,struct vmmw_error_t**error);
vmmw_status_t vmmw_tag_pop(struct vmmw_error_t**error);
vmmw_status_t vmmw_tag_push(uint32_t tag,struct vmmw_error_t**error);
vmmw_status_t vmmw_tag_remap_epoch(uint32_t tag,uint64_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_tag_set_process_default(uint32_t tag,struct vmmw_error_t**error);
vmmw_status_t vmmw_unpack(const char*input,const char*output,const struct vmmw_pack_options_t*options,vmmw_progress_fn progress,void*user,struct vmmw_pack_report_t*report,struct vmmw_error_t**error);
vmmw_status_t vmmw_update(struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,struct vmmw_update_source_t*source,const struct vmmw_update_options_t*options_in,struct vmmw_update_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_broadcast_receive(struct vmmw_nccl_comm_t*comm,struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,uint32_t root,uint64_t slot_bytes,uint64_t timeout_ms,const struct vmmw_update_options_t*options_in,struct vmmw_update_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_broadcast_root(struct vmmw_nccl_comm_t*comm,struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,struct vmmw_update_source_t*source,uint64_t slot_bytes,uint64_t timeout_ms,const struct vmmw_update_options_t*options_in,struct vmmw_update_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_broadcast_send(struct vmmw_nccl_comm_t*comm,struct vmmw_pool_t*pool,struct vmmw_update_source_t*source,uint64_t slot_bytes,uint64_t timeout_ms,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_receive_ipc(struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,const char*path,uint64_t timeout_ms,const struct vmmw_update_options_t*options_in,struct vmmw_update_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_receiver_drop_imports(struct vmmw_update_receiver_t*receiver,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_receiver_new(struct vmmw_pool_t*pool,const char*path,uint64_t timeout_ms,uint64_t max_kept_imports,uint64_t max_kept_bytes,struct vmmw_update_receiver_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_receiver_prepare(struct vmmw_update_receiver_t*receiver,struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,const struct vmmw_update_options_t*options_in,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_receiver_receive(struct vmmw_update_receiver_t*receiver,struct vmmw_loader_t*loader,struct vmmw_pool_t*pool,const struct vmmw_update_options_t*options_in,struct vmmw_update_result_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_receiver_stats(const struct vmmw_update_receiver_t*receiver,struct vmmw_receive_stats_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_sender_new(struct vmmw_pool_t*pool,const char*path,uint32_t slots,uint64_t slot_bytes,uint64_t timeout_ms,struct vmmw_update_sender_t**out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_sender_offer_direct(struct vmmw_update_sender_t*sender,struct vmmw_update_source_t*source,uint32_t receivers,struct vmmw_send_report_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_sender_send(struct vmmw_update_sender_t*sender,struct vmmw_update_source_t*source,uint32_t receivers,struct vmmw_send_report_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_sender_send_direct(struct vmmw_update_sender_t*sender,struct vmmw_update_source_t*source,uint32_t receivers,struct vmmw_send_report_t*out,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_source_add(struct vmmw_update_source_t*source,const char*name,const char*dtype,const uint64_t*shape,size_t ndim,uint64_t ptr,vmmw_update_memory_t memory,struct vmmw_error_t**error);
vmmw_status_t vmmw_update_source_new(struct vmmw_update_source_t**out,struct vmmw_error_t**error);
void vmmw_control_server_free(struct vmmw_control_server_t*server);
void vmmw_device_free(struct vmmw_device_t*device);
void vmmw_error_free(struct vmmw_error_t*error);
void vmmw_loader_free(struct vmmw_loader_t*loader);
void vmmw_metadata_free(struct vmmw_metadata_t*meta);
void vmmw_nccl_comm_free(struct vmmw_nccl_comm_t*comm);
void vmmw_pool_free(struct vmmw_pool_t*pool);
void vmmw_segment_free(struct vmmw_segment_t*segment);
void vmmw_share_free(struct vmmw_share_t*share);
void vmmw_share_server_free(struct vmmw_share_server_t*server);
void vmmw_torch_free(void*ptr,ptrdiff_t size,int32_t device,void*stream);
void vmmw_update_receiver_free(struct vmmw_update_receiver_t*receiver);
void vmmw_update_sender_free(struct vmmw_update_sender_t*sender);
void vmmw_update_source_free(struct vmmw_update_source_t*source);
void*vmmw_torch_malloc(ptrdiff_t size,int32_t device,void*stream);
